"""Golden test: speculative greedy tokens from a pack equal transformers' greedy `generate` of the target
alone (fp32), for every family, draft kind and k, with the model drafter and the n-gram drafter, at fixed k
and adaptive k ("auto"), and from a pack exported without a draft model; with an identical draft, every
draft is accepted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import specpack

TEXT_PROMPTS = ["def add(a, b):", "Hello", "The quick brown fox jumps over the lazy dog."]
LONG_PROMPT_TOKENS = 120
CASES = [  # (family, draft kind, pair options): small/identical/perturbed drafts, head_dim 12 and 20, short limits
    ("llama", "small", {}),
    ("llama", "same", {"head_dim": 20}),
    ("qwen2", "noisy", {}),
    ("qwen2", "same", {"max_positions": 160}),
    ("gpt2", "noisy", {"max_positions": 192}),
    ("gpt2", "same", {}),
    ("mistral", "small", {"head_dim": 20}),
]
SETTINGS = [("model", 1), ("model", 2), ("model", 4), ("model", 8), ("model", None), ("ngram", 2), ("ngram", 8),
            ("ngram", None)]  # (drafter, k); None: adaptive


def _prompts(vocab_size: int) -> list[str | list[int]]:
    """1 to 240 tokens; the last one repeats itself, so the n-gram drafter has matches to propose."""
    long_ids = np.random.default_rng(0).integers(0, vocab_size - 8, LONG_PROMPT_TOKENS).tolist()
    return [*TEXT_PROMPTS, [3], long_ids, long_ids + long_ids[:60]]


def _reference(target_dir: Path, ids: list[int], max_new: int, eos: list[int]) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize(("family", "draft", "pair"), CASES, ids=[f"{f}-{d}-{p}" for f, d, p in CASES])
def test_speculative_greedy_equals_target_generate(tiny_pack, family: str, draft: str, pair: dict[str, int]) -> None:
    pack_dir, _, target_dir = tiny_pack(family, draft, **pair)
    pack = specpack.load(pack_dir)
    proposed = dict.fromkeys(SETTINGS, 0)
    for prompt in _prompts(pack.tokenizer.vocab_size):
        ids = pack.encode(prompt)
        max_new = min(40, pack.manifest.max_len - len(ids))
        if max_new < 1:
            continue
        ref = _reference(target_dir, ids, max_new, pack.manifest.eos_token_ids)
        for drafter, k in SETTINGS:
            out = pack.generate(prompt, max_new, k=k, drafter=drafter)
            assert out.tokens == ref, (prompt, drafter, k)
            assert out.stats["new_tokens"] == len(ref) and out.stats["drafter"] == drafter
            proposed[(drafter, k)] += out.stats["proposed"]
            if draft == "same" and drafter == "model" and out.stats["proposed"]:
                assert out.stats["alpha"] == 1.0
    assert all(proposed.values()), proposed  # every setting drafted something somewhere


@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_ngram_pack_greedy_equals_target_generate(tiny_ngram_pack, family: str) -> None:
    """A pack exported with --drafter ngram: the target alone, drafting by prompt lookup (every family drafts by
    prompt lookup in the test above; two export the pack without a draft model here, to keep CI short)."""
    pack_dir, target_dir = tiny_ngram_pack(family)
    pack = specpack.load(pack_dir)
    assert pack.manifest.drafter == "ngram" and pack.manifest.draft_model is None
    assert not (pack_dir / "draft_step.onnx").exists()
    proposed = 0
    for prompt in _prompts(pack.tokenizer.vocab_size)[2:]:  # the last text prompt, one token, 120 and 180 tokens
        ids = pack.encode(prompt)
        max_new = min(40, pack.manifest.max_len - len(ids))
        ref = _reference(target_dir, ids, max_new, pack.manifest.eos_token_ids)
        for k in (None, 0, 3, 8):
            out = pack.generate(prompt, max_new, k=k)
            assert out.tokens == ref, (prompt, k)
            assert out.stats["drafter"] == "ngram"
            proposed += out.stats["proposed"]
    assert proposed > 0


def test_stops_at_eos_ids_like_transformers(tiny_pack, tmp_path: Path) -> None:
    """Make a token the target emits greedily an eos id: both stop there, the eos included."""
    import shutil

    pack_dir, _, target_dir = tiny_pack("qwen2", "noisy")
    free = specpack.load(pack_dir).generate("def add(a, b):", 40, k=4).tokens
    eos_token = free[len(free) // 2]
    copy = tmp_path / "pack"
    shutil.copytree(pack_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["eos_token_ids"] = [eos_token]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    pack = specpack.load(copy)
    ids = pack.encode("def add(a, b):")
    ref = _reference(target_dir, ids, 40, [eos_token])
    for k in (1, 3, 8):
        out = pack.generate("def add(a, b):", 40, k=k)
        assert out.tokens == ref and out.tokens[-1] == eos_token
        assert eos_token not in out.tokens[:-1]


def test_chat_prompt_matches_transformers_chat_template(tiny_pack) -> None:
    """--chat: the prompt wrapped as one user message with the generation prompt, as apply_chat_template does."""
    from transformers import AutoTokenizer

    pack_dir, _, target_dir = tiny_pack("qwen2", "noisy")
    pack = specpack.load(pack_dir)
    message = "Write a function that adds two numbers."
    ids = AutoTokenizer.from_pretrained(target_dir).apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert pack.encode(message, chat=True) == list(ids)
    ref = _reference(target_dir, list(ids), 24, pack.manifest.eos_token_ids)
    assert pack.generate(message, 24, k=4, chat=True).tokens == ref
