"""Golden test through static-cache packs: the cpu backend picks the static KV cache from the manifest's
graph form, and speculative greedy tokens equal transformers' greedy `generate` of the target alone."""

from __future__ import annotations

import numpy as np
import pytest
from test_greedy_golden import TEXT_PROMPTS, _reference

import specpack
from specpack.runtime.static_kv_cache import StaticKVCache

# (family, draft kind, attention, pair options): both attention forms; GQA where head_dim % 8 == 0
CASES = [
    ("llama", "small", "standard", {}),
    ("qwen2", "noisy", "gqa", {"head_dim": 16}),
    ("qwen2", "same", "standard", {"max_positions": 160}),
]


@pytest.mark.parametrize(("family", "draft", "attention", "pair"), CASES,
                         ids=[f"{f}-{d}-{a}" for f, d, a, _ in CASES])
def test_static_pack_greedy_equals_target_generate(tiny_pack, family: str, draft: str, attention: str,
                                                   pair: dict[str, int]) -> None:
    pack_dir, _, target_dir = tiny_pack(family, draft, kv_cache="static", attention=attention, **pair)
    pack = specpack.load(pack_dir)
    assert pack.manifest.target.graph.kv_cache == "static"
    assert isinstance(pack.backend.target().engine.caches[0], StaticKVCache)  # type: ignore[attr-defined]
    long_ids = np.random.default_rng(1).integers(0, pack.tokenizer.vocab_size - 8, 100).tolist()
    for prompt in [TEXT_PROMPTS[0], [3], long_ids]:
        ids = pack.encode(prompt)
        max_new = min(32, pack.manifest.max_len - len(ids))
        ref = _reference(target_dir, ids, max_new, pack.manifest.eos_token_ids)
        for k in (0, 1, 4):
            out = pack.generate(prompt, max_new, k=k)
            assert out.tokens == ref, (prompt, k)
            if draft == "same" and out.stats["proposed"]:
                assert out.stats["alpha"] == 1.0
