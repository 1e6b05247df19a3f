"""How close a quantized graph stays to its unquantized reference, measured on the same token sequences.

    target  top-1 agreement and mean KL(p_ref || p_quant) of the next-token distributions, teacher-forced
            on each sequence (a quantized target is a different model: speculation stays lossless with
            respect to it, and these numbers say how far it moved)
    draft   greedy alpha and tau (DESIGN.md's names) of the quantized and of the reference draft, against
            the same target, for every k

Greedy alpha needs no decode loop. On the target's own greedy continuation T, drafting from a committed
prefix T[:c], draft i (0-based) is accepted iff it and every draft before it equal T's next tokens, and
while they do the draft reads exactly T; so draft i is accepted iff argmax draft(T[:c+j]) == T[c+j] for
j = 0..i. One teacher-forced draft pass over T gives those argmaxes at every position, and
`greedy_acceptance` runs runtime/loop.py's own steps over them (runtime/replay.py: k capped at the tokens still to
emit, the greedy acceptance test of graphs/oracle.py).

Works on any pair of plain graphs with the export/ contract (names.py), so calibrated Q/DQ graphs reuse it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specpack import names

# Built-in fidelity prompts: code and prose, short, written for this purpose (plain completion).
PROMPTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import json\n\n\ndef load_config(path):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "The three most important ideas in operating systems are",
    "Photosynthesis is the process by which plants",
    "Q: A train travels 120 km in 1.5 hours. What is its average speed?\nA:",
)
CONTINUATION = 48  # new tokens per prompt: the target's greedy continuation
Prompt = tuple[str, bool]  # (text, wrapped in the chat template)


def prompt_texts(path: str | None, limit: int) -> tuple[list[Prompt], str]:
    """(text, chat) of the first `limit` prompts of a prompt file (specpack/prompts.py's formats), or the built-in
    PROMPTS; and where they came from."""
    if path is None:
        return [(p, False) for p in PROMPTS], "built-in"
    from specpack.prompts import read_prompts

    return [(p.text, p.chat) for p in read_prompts([path])[:limit]], f"{Path(path).name}, first {limit}"


class PlainSession:
    """An ONNX Runtime session over a plain graph: logits of whole sequences, and greedy decoding."""

    def __init__(self, path: Path, threads: int | None = None) -> None:
        import onnxruntime as ort

        from specpack.runtime.ort_session import session_options

        self.session = ort.InferenceSession(str(path), sess_options=session_options(threads),
                                            providers=["CPUExecutionProvider"])
        self.past = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]
        self.kv_dtype = np.float16 if self.past and self.past[0].type == "tensor(float16)" else np.float32
        self.presents = [o.name for o in self.session.get_outputs() if o.name.startswith("present.")]

    def _run(self, ids: Sequence[int], past: list[np.ndarray] | None) -> tuple[np.ndarray, list[np.ndarray]]:
        length = 0 if past is None else past[0].shape[2]
        x = np.asarray([ids], np.int64)  # [1, S]
        feeds: dict[str, np.ndarray] = {
            names.INPUT_IDS: x,
            names.POSITION_IDS: np.arange(length, length + x.shape[1], dtype=np.int64)[None],
            names.ATTENTION_MASK: np.ones((1, length + x.shape[1]), np.int64),
        }
        for i, spec in enumerate(self.past):
            feeds[spec.name] = past[i] if past is not None else np.zeros((1, spec.shape[1], 0, spec.shape[3]), self.kv_dtype)
        logits, *present = self.session.run([names.LOGITS, *self.presents], feeds)
        return logits[0].astype(np.float32), present  # [S, V]

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Next-token logits at every position of `ids`, one pass from an empty cache: [S, V]."""
        return self._run(ids, None)[0]

    def greedy(self, ids: Sequence[int], new_tokens: int, eos_ids: frozenset[int] = frozenset()) -> list[int]:
        """Greedy continuation (prefill, then one token a step on the cache), up to `new_tokens` or an eos."""
        logits, past = self._run(ids, None)
        out = [int(logits[-1].argmax())]
        while len(out) < new_tokens and out[-1] not in eos_ids:
            logits, past = self._run(out[-1:], past)
            out.append(int(logits[-1].argmax()))
        return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@dataclass
class LogitAgreement:
    """Teacher-forced comparison of two models' next-token distributions, summed over positions."""

    positions: int = 0
    top1_agree: int = 0
    kl_sum: float = 0.0
    kl_max: float = 0.0

    def add(self, ref_logits: np.ndarray, cand_logits: np.ndarray) -> None:
        """ref, cand [S, V] at the same positions."""
        ref, cand = log_softmax(ref_logits.astype(np.float64)), log_softmax(cand_logits.astype(np.float64))
        kl = (np.exp(ref) * (ref - cand)).sum(axis=-1)  # [S] KL(p_ref || p_cand)
        self.positions += ref.shape[0]
        self.top1_agree += int((ref.argmax(-1) == cand.argmax(-1)).sum())
        self.kl_sum += float(kl.sum())
        self.kl_max = max(self.kl_max, float(kl.max()))

    def to_dict(self) -> dict[str, Any]:
        return {"positions": self.positions, "top1_agreement": self.top1_agree / self.positions if self.positions else None,
                "mean_kl": self.kl_sum / self.positions if self.positions else None, "max_kl": self.kl_max}


@dataclass
class Acceptance:
    """Greedy speculative decoding replayed from argmaxes: DESIGN.md's counts, pooled over sequences."""

    steps: int = 0
    proposed: int = 0
    accepted: int = 0

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    @property
    def tau(self) -> float | None:
        return (self.accepted + self.steps) / self.steps if self.steps else None

    def to_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "tau": self.tau, "steps": self.steps, "proposed": self.proposed,
                "accepted": self.accepted}


def greedy_acceptance(draft_next: Sequence[int], sequence: Sequence[int], prompt_len: int, k: int,
                      into: Acceptance | None = None) -> Acceptance:
    """Greedy speculative decoding with k drafts a step, replayed through runtime/loop.py's own steps
    (runtime/replay.py).

    sequence: prompt + the target's greedy continuation (all of it is emitted); draft_next[i]: the draft's
    argmax after reading sequence[: i + 1]. The prefill emits the first new token; each step proposes
    min(k, tokens left - 1) drafts and emits the accepted ones plus one target token.
    """
    from specpack.runtime.k_policy import FixedK
    from specpack.runtime.replay import ArgmaxDrafter, replay_greedy

    acc = into if into is not None else Acceptance()
    stats = replay_greedy(sequence, prompt_len, ArgmaxDrafter(draft_next), FixedK(k)).stats
    acc.steps += stats.steps
    acc.proposed += stats.proposed
    acc.accepted += stats.accepted
    return acc


@dataclass(frozen=True)
class FidelityInputs:
    """The plain graphs of one pack, quantized and not; None where a model is not quantized."""

    target: Path                      # the target graph the pack uses (quantized or not)
    draft: Path                       # the draft graph the pack uses
    target_reference: Path | None     # the unquantized target, when the target is quantized
    draft_reference: Path | None      # the unquantized draft, when the draft is quantized
    tokenizer_dir: Path               # the pack's tokenizer/ (to encode PROMPTS)
    eos_ids: tuple[int, ...]
    ks: tuple[int, ...]
    threads: int | None = None
    new_tokens: int = CONTINUATION
    # whose greedy continuations are teacher-forced: "target" (the pack's target, which the drafts draft for) or
    # "reference" (the unquantized target's; for a quantized target alone: a slow Q/DQ graph on the CPU then runs
    # once a prompt instead of once a token)
    continuations: str = "target"


def measure_fidelity(inputs: FidelityInputs, prompts: tuple[list[Prompt], str] | None = None) -> dict[str, Any]:
    """{"target": {...}, "draft": {...}} for whichever of the two is quantized (see the module docstring).

    One session at a time, so the peak memory is one model's: the pack's target (greedy continuations, and
    its teacher-forced logits when the target is quantized), then the reference target, then the drafts.
    """
    from specpack.runtime.tokenizer import PackTokenizer

    start = time.perf_counter()
    texts, prompt_source = prompts or prompt_texts(None, len(PROMPTS))
    tokenizer = PackTokenizer.load(inputs.tokenizer_dir)
    encoded = [tokenizer.encode_chat(text) if chat else tokenizer.encode(text) for text, chat in texts]
    eos = frozenset(inputs.eos_ids)
    by_reference, generator = inputs.continuations == "reference", inputs.target
    if by_reference:
        if inputs.target_reference is None or inputs.draft_reference is not None:
            raise ValueError("continuations='reference' measures a quantized target alone (no draft_reference)")
        generator = inputs.target_reference
    first = PlainSession(generator, inputs.threads)
    sequences = [ids + first.greedy(ids, inputs.new_tokens, eos) for ids in encoded]
    result: dict[str, Any] = {"prompts": len(texts), "prompt_source": prompt_source, "new_tokens": inputs.new_tokens,
                              "tokens": sum(len(s) for s in sequences)}
    if inputs.target_reference is not None:
        first_logits = [first.logits(s) for s in sequences]  # [S, V] each
        del first
        second = PlainSession(inputs.target if by_reference else inputs.target_reference, inputs.threads)
        agreement = LogitAgreement()
        for seq, logits in zip(sequences, first_logits, strict=True):
            ref, cand = (logits, second.logits(seq)) if by_reference else (second.logits(seq), logits)
            agreement.add(ref, cand)
        del second, first_logits
        whose = "the unquantized" if by_reference else "the quantized"
        result["target"] = {**agreement.to_dict(), "against": "the unquantized target, teacher-forced on "
                            f"{whose} target's greedy continuations of the fidelity prompts"}
    else:
        del first
    if inputs.draft_reference is not None:
        rows: dict[str, dict[str, Any]] = {}
        for label, path in (("reference", inputs.draft_reference), ("quantized", inputs.draft)):
            draft = PlainSession(path, inputs.threads)
            nexts = [draft.logits(s).argmax(-1) for s in sequences]
            del draft
            for k in inputs.ks:
                acc = Acceptance()
                for seq, ids, nxt in zip(sequences, encoded, nexts, strict=True):
                    greedy_acceptance(nxt.tolist(), seq, len(ids), k, acc)
                rows.setdefault(str(k), {})[label] = acc.to_dict()
        for row in rows.values():
            ref, quant = row["reference"]["alpha"], row["quantized"]["alpha"]
            row["alpha_delta"] = quant - ref if ref is not None and quant is not None else None
        result["draft"] = {"by_k": rows, "against": "the unquantized draft, both drafting for the pack's target "
                           "on its greedy continuations of the fidelity prompts (greedy replay)"}
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result
