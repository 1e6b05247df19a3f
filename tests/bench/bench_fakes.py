"""Bench test helpers: a Pack on the numpy reference engines (no graphs, no files), and synthetic runs.

    make_fake_pack(k_max=4)          a real `Pack` on the reference backend over bigram models
    stats(k, steps=..., ...)         the runtime's per-generation stats dict, written by hand
    costs(c, v)                      StepCosts with the given c and v(k)
    make_run(runs, ks)               a BenchRun of hand-written PromptRuns, for the report maths
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from specpack.bench.runner import BenchConfig, BenchRun, Decode, PromptRun
from specpack.bench.timing import StepCosts
from specpack.prompts import BenchPrompt
from specpack.runtime.backends.reference import ReferenceBackend, bigram_logits
from specpack.runtime.pack import Pack

V = 32


class CharTokenizer:
    """One id per character (mod V); chat prompts get a two-token header."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) % V for c in text]

    def encode_chat(self, text: str) -> list[int]:
        return [1, 2, *self.encode(text)]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(map(str, ids))


def make_fake_pack(k_max: int = 4, max_len: int = 200, draft_noise: float = 1.5) -> Pack:
    rng = np.random.default_rng(0)
    target_table = rng.normal(0, 3.0, (V, V)).astype(np.float32)  # [V, V]
    draft_table = target_table + rng.normal(0, draft_noise, (V, V)).astype(np.float32)
    manifest = SimpleNamespace(
        k_max=k_max, max_len=max_len, vocab_size=V, quantization=None, eos_token_ids=[],
        drafter="model",
        draft=(draft := SimpleNamespace(dtype="fp32", source={"source": "draft", "resolved": None}, quantization=None)),
        draft_model=draft,
        target=SimpleNamespace(dtype="fp32", source={"source": "target", "resolved": None}, quantization=None,
                               graph=SimpleNamespace(tree=None)))
    backend = ReferenceBackend(bigram_logits(target_table), lambda: bigram_logits(draft_table), V, k_max)
    return Pack(Path("fake-pack"), manifest, CharTokenizer(), backend)  # type: ignore[arg-type]


def stats(k: int, *, steps: int, accepted: int, new_tokens: int, decode_s: float, ttft_s: float = 0.1,
          per_position: list[float | None] | None = None) -> dict[str, Any]:
    """The runtime's stats dict (DecodeStats.to_dict) for one decode with `steps` full k-draft steps."""
    proposed = k * steps
    tps = (new_tokens - 1) / decode_s
    return {"alpha": accepted / proposed if proposed else 0.0, "tau": (accepted + steps) / steps if steps else 0.0,
            "steps": steps, "proposed": proposed, "accepted": accepted,
            "per_position": per_position if per_position is not None else [None] * k, "tokens_per_s": tps, "k": k,
            "new_tokens": new_tokens, "ttft_s": ttft_s, "decode_s": decode_s}


def costs(c: float = 0.25, v: dict[int, float] | None = None) -> StepCosts:
    verify = v or {1: 1.0, 2: 1.0, 4: 1.1}
    return StepCosts(context_tokens=64, reps=1, target_step_s=0.1, draft_step_s=0.1 * c,
                     verify_s={k: 0.1 * x for k, x in verify.items()})


def make_run(runs: list[PromptRun], ks: tuple[int, ...], step_costs: StepCosts | None = None,
             temperature: float = 0.0) -> BenchRun:
    return BenchRun(config=BenchConfig(ks=ks, temperature=temperature), ks=ks,
                    pack={"path": "p", "dtype": "fp32", "eos_token_ids": []}, runs=runs,
                    costs=step_costs or costs(), peak_memory={"peak_rss_mb": {"load": 100.0}})


def prompt_run(pid: str, category: str, ar: Decode, spec: dict[int, Decode]) -> PromptRun:
    return PromptRun(BenchPrompt(pid, category, "text", chat=False), [1, 2, 3], ar, spec)
