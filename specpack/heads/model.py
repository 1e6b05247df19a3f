"""The draft head (EAGLE-3 style, docs/design/heads_and_trees.md §2.2) in torch: training and the export forward.

    g_t = cat(h_{tap_1}, h_{tap_2}, ...)_t       [F]   the target's residual stream entering the tapped layers
    row t = (a_t, x_{t+1})                             predicts x_{t+2}
      a_t = fc(g_t)          a row computed from target features (fc: F -> H, no bias)
      a_t = o_{t-1}          a row fed the head's own previous output (drafting; training-time test)
    u = cat(RMSNorm_in(E[x_{t+1}]), RMSNorm_h(a))                    [2H]
    attention: q = Wq u, k = Wk u, v = Wv u (GQA, RoPE at position t, no bias);  h = a + Wo attn
    o = h + MLP_SiLU(RMSNorm_post(h))                                [H]   (o is what the next own row reads)
    logits over the subset = W_sub RMSNorm_f(o)                      [V_sub]
    full-vocabulary logits: -inf outside the subset, so softmax(q) is exactly zero there

E (the target's input embedding, full vocabulary) and W_sub (the target's lm_head rows of the subset) are frozen
buffers taken from the target; they are not stored in the head file (head_file.py). RMSNorm_f starts as the
target's final norm and is trained.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

STEP_WEIGHT = 0.8  # training-time-test step i weighs STEP_WEIGHT ** i (EAGLE-3 traineagle3/main.py)


@dataclass(frozen=True)
class HeadConfig:
    """Shapes of a head; the attention geometry and MLP width are the target's."""

    model_type: str          # the target's config.model_type
    target_hidden: int       # H_t: the target's hidden size
    taps: tuple[int, ...]    # layer indices whose input (transformers' hidden_states[i]) is tapped
    hidden: int              # H: the head's hidden size (= H_t)
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rope_theta: float
    rms_eps: float
    vocab_rows: int          # the target's lm_head rows (the full vocabulary the head's q is written over)
    subset_size: int         # V_sub: rows of the lm_head the head computes

    @property
    def feature_dim(self) -> int:
        return self.target_hidden * len(self.taps)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "taps": list(self.taps)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeadConfig:
        return cls(**{**data, "taps": tuple(data["taps"])})


def default_taps(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's rule (layer 2, the middle one, the third from the end), clamped into 0..num_layers-1."""
    return tuple(min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class DraftHead(nn.Module):
    """The head; `embed` [V, H_t] and `lm_rows` [V_sub, H] are frozen buffers, `subset` int64 [V_sub] the token ids."""

    embed: torch.Tensor     # [V, H]       frozen, from the target
    lm_rows: torch.Tensor   # [V_sub, H]   frozen, from the target
    subset: torch.Tensor    # int64 [V_sub] token ids, sorted (stored in the head file)
    inv_freq: torch.Tensor  # [head_dim / 2] RoPE frequencies

    def __init__(self, config: HeadConfig, embed: torch.Tensor, lm_rows: torch.Tensor, subset: torch.Tensor):
        super().__init__()
        c = self.config = config
        h, q_dim, kv_dim = c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim
        self.fc = nn.Linear(c.feature_dim, h, bias=False)
        self.in_norm = RMSNorm(h, c.rms_eps)
        self.h_norm = RMSNorm(h, c.rms_eps)
        self.q_proj = nn.Linear(2 * h, q_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, kv_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, kv_dim, bias=False)
        self.o_proj = nn.Linear(q_dim, h, bias=False)
        self.post_norm = RMSNorm(h, c.rms_eps)
        self.gate_proj = nn.Linear(h, c.intermediate, bias=False)
        self.up_proj = nn.Linear(h, c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, h, bias=False)
        self.final_norm = RMSNorm(h, c.rms_eps)
        self.register_buffer("embed", embed.detach().clone(), persistent=False)      # [V, H]
        self.register_buffer("lm_rows", lm_rows.detach().clone(), persistent=False)  # [V_sub, H]
        self.register_buffer("subset", subset.detach().clone().to(torch.int64))       # [V_sub] stored in the file
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)                 # [head_dim / 2]

    # -- pieces shared by training and the export forward -------------------------------------------------------

    def project(self, a: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """a [B, S, H], ids [B, S] -> q [B, S, heads * D], k / v [B, S, kv_heads * D] (before RoPE)."""
        u = torch.cat([self.in_norm(self.embed[ids]), self.h_norm(a)], dim=-1)  # [B, S, 2H]
        return self.q_proj(u), self.k_proj(u), self.v_proj(u)

    def _qkv(self, a: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """a [B, S, H], ids [B, S], positions [S] -> q [B, heads, S, D], k / v [B, kv_heads, S, D] (RoPE applied)."""
        c = self.config
        b, s = ids.shape
        q, k, v = self.project(a, ids)
        q = q.view(b, s, c.heads, c.head_dim).transpose(1, 2)
        k = k.view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        v = v.view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [S, D/2]
        emb = torch.cat([angles, angles], dim=-1)  # [S, D]
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """q [B, heads, S, D], k / v [B, kv_heads, T, D], allowed bool [S, T] -> [B, S, heads * D]."""
        c = self.config
        group = c.heads // c.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q.to(torch.float32) @ k.to(torch.float32).transpose(-1, -2)) * c.head_dim ** -0.5  # [B, h, S, T]
        scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1).to(v.dtype)
        out = weights @ v  # [B, heads, S, D]
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], c.heads * c.head_dim)

    def finish(self, a: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual + MLP: -> o [B, S, H]."""
        h = a + self.o_proj(attn)
        x = self.post_norm(h)
        return h + self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    def subset_logits(self, o: torch.Tensor) -> torch.Tensor:
        """o [..., H] -> logits over the subset [..., V_sub]."""
        return self.final_norm(o) @ self.lm_rows.to(o.dtype).T

    def full_logits(self, o: torch.Tensor) -> torch.Tensor:
        """o [B, S, H] -> [B, S, V]: the subset's logits, -inf elsewhere (softmax exactly 0 outside the subset)."""
        return self.spread(self.subset_logits(o))

    def spread(self, sub: torch.Tensor) -> torch.Tensor:
        """Subset logits [B, S, V_sub] -> [B, S, V], -inf outside the subset."""
        full = torch.full((*sub.shape[:-1], self.config.vocab_rows), float("-inf"), dtype=sub.dtype)
        index = self.subset.expand(*sub.shape[:-1], -1)
        return full.scatter(-1, index, sub)

    # -- training: the training-time test ------------------------------------------------------------------------

    def ttt_forward(self, features: torch.Tensor, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Subset logits of every training-time-test step: features [B, N, F], ids [B, N] -> steps x [B, n, V_sub].

        n = N - 1 rows; row t reads (a, x_{t+1}) and predicts x_{t+2}. Step 0: a = fc(g_t). Step i >= 1: a = the
        step i-1 output of row t-1 (as at run time, the head fed its own output), attending to step 0's keys at
        positions <= t - i and to step j's key at position t - i + j for j = 1..i (EAGLE-3's diagonal pattern: what
        the i-th drafted row sees at run time). Rows t < i have no such input (zeros): the loss masks them.
        """
        n = ids.shape[1] - 1
        next_ids = ids[:, 1:]  # [B, n] x_{t+1}
        positions = torch.arange(n, device=ids.device)
        a = self.fc(features[:, :n])  # [B, n, H]
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        t = positions[:, None]
        s = positions[None, :]
        out: list[torch.Tensor] = []
        for i in range(steps):
            q, k, v = self._qkv(a, next_ids, positions)
            keys.append(k)
            values.append(v)
            blocks = [s <= t - i] + [s == t - i + j for j in range(1, i + 1)]  # each [n, n]
            o = self.finish(a, self._attend(q, torch.cat(keys, 2), torch.cat(values, 2), torch.cat(blocks, 1)))
            out.append(self.subset_logits(o))
            a = torch.cat([torch.zeros_like(o[:, :1]), o[:, :-1]], dim=1)  # row t gets o of row t - 1
        return out

    # -- one drafting run (exported as head_step.onnx) -----------------------------------------------------------

    def step(self, input_ids: torch.Tensor, features: torch.Tensor, draft_ids: torch.Tensor, hidden_in: torch.Tensor,
             past_key: torch.Tensor, past_value: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One run over C feature rows then W own rows, after L cached rows (batch 1, concat cache):

            input_ids [1, C], features [1, C, F]     rows from the target's features
            draft_ids [1, W], hidden_in [1, W, H]    rows fed the head's own output (W = 1 when drafting)
            past_key / past_value [1, kv_heads, L, D]
            -> logits [1, 1, V] (last row, -inf outside the subset), hidden_out [1, 1, H] (its o),
               present_key / present_value [1, kv_heads, L + C + W, D]
        Row r sits at position L + r and attends to every cached row and the rows before it.
        """
        a = torch.cat([self.fc(features), hidden_in], dim=1)  # [1, S, H]
        ids = torch.cat([input_ids, draft_ids], dim=1)  # [1, S]
        past_len, new = past_key.shape[2], a.shape[1]
        positions = torch.arange(past_len, past_len + new)  # a Range over shapes: no shape scalar added to data
        q, k, v = self._qkv(a, ids, positions)
        keys, values = torch.cat([past_key, k], 2), torch.cat([past_value, v], 2)
        allowed = torch.arange(past_len + new)[None, :] <= positions[:, None]  # [S, L + S]
        o = self.finish(a, self._attend(q, keys, values, allowed))
        last = o[:, -1:]
        return self.full_logits(last), last, keys, values


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def soft_kl(logits: torch.Tensor, target_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over masked rows of KL(p || q) = sum_v p(v) (log p(v) - log q(v)): logits / probs [B, n, V_sub],
    mask bool [B, n]. The soft-label cross-entropy minus the target's entropy: the same gradient, and 0 at a perfect
    head (the cross-entropy's floor is the target's entropy, which hides progress on a flat target)."""
    log_q = torch.log_softmax(logits.to(torch.float32), dim=-1)
    per_row = (torch.special.xlogy(target_probs, target_probs) - target_probs * log_q).sum(-1)  # [B, n]
    weight = mask.to(per_row.dtype)
    return (per_row * weight).sum() / weight.sum().clamp(min=1.0)
