"""The decode-step attention used to generate the training data (specpack/distill/grouped_attention.py): the same
attention as transformers' eager one (every key/value head repeated per query head, the reference), on a grouped-head
model, left-padded batches, greedy and sampled."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from specpack.distill.data import generate
from specpack.distill.grouped_attention import IMPLEMENTATION, grouped_decode_attention, use_grouped_decode
from tests.tiny import make_model


@pytest.fixture(scope="module")
def grouped_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen2 with 6 query heads over 2 key/value heads (groups of 3, as the 1.5B target's 12 over 2)."""
    return make_model("qwen2", tmp_path_factory.mktemp("grouped") / "m", heads=6, kv_heads=2, head_dim=8)


def _load(path: Path, implementation: str) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    if implementation == IMPLEMENTATION:
        use_grouped_decode(model)
    else:
        model.set_attn_implementation(implementation)
    return model


def test_decode_attention_equals_the_repeated_heads_attention() -> None:
    """One query row per sequence against a padded cache: equal to repeating each key/value head (the eager way)."""
    torch.manual_seed(0)
    batch, kv_heads, groups, length, dim = 3, 2, 3, 7, 8
    query = torch.randn(batch, kv_heads * groups, 1, dim)
    key, value = torch.randn(batch, kv_heads, length, dim), torch.randn(batch, kv_heads, length, dim)
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    mask[0, :, :, :3] = False  # row 0 left-padded by 3
    module = torch.nn.Module()
    module.num_key_value_groups = groups  # type: ignore[assignment]
    module.eval()
    out, _ = grouped_decode_attention(module, query, key, value, mask, scaling=dim ** -0.5)
    repeated_k = key.repeat_interleave(groups, dim=1)  # [B, H, L, D]
    repeated_v = value.repeat_interleave(groups, dim=1)
    scores = (query @ repeated_k.transpose(-1, -2)) * dim ** -0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    reference = (scores.softmax(-1) @ repeated_v).transpose(1, 2)  # [B, 1, H, D]
    assert out.shape == (batch, 1, kv_heads * groups, dim)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
    # the wrong grouping (query heads dealt round-robin to key/value heads) is caught by the same comparison
    wrong = query.reshape(batch, groups, kv_heads, dim).transpose(1, 2)  # [B, Hkv, G, D] from the wrong heads
    wrong_out = torch.nn.functional.scaled_dot_product_attention(wrong, key, value, attn_mask=mask, scale=dim ** -0.5)
    assert not torch.allclose(wrong_out.transpose(1, 2).reshape(batch, 1, -1), reference.reshape(batch, 1, -1),
                              atol=1e-3)


@pytest.mark.parametrize("temperature", [None, 0.8])
def test_generation_gives_the_eager_models_tokens(grouped_model_dir: Path, temperature: float | None) -> None:
    """Left-padded batched generation (distill's `generate`): the grouped decode gives eager attention's tokens."""
    prompts = [[5, 9, 13, 21, 8, 40], [7, 3], [11, 12, 13, 14], [30]]
    outs = {}
    for implementation in ("eager", IMPLEMENTATION):
        torch.manual_seed(3)
        outs[implementation] = generate(_load(grouped_model_dir, implementation), prompts, 12, temperature, eos=0)
    assert outs[IMPLEMENTATION] == outs["eager"]
    assert sum(len(answer) for answer in outs["eager"]) >= 24  # decode steps ran (0 is a rare token here)


def test_prefill_is_transformers_own(grouped_model_dir: Path) -> None:
    """Several new tokens (the training's forward passes): transformers' sdpa function, logits equal to sdpa's."""
    ids = torch.tensor([[5, 9, 13, 21, 8, 40, 3, 2]])
    with torch.no_grad():
        grouped = _load(grouped_model_dir, IMPLEMENTATION)(ids).logits
        stock = _load(grouped_model_dir, "sdpa")(ids).logits
    assert torch.equal(grouped, stock)
