"""Pre-capture (runtime/backends/cuda_precapture.py) on the cuda backend's code, run on the CPU EP: every shape a
greedy chain request runs was already run at load, so no graph is captured mid-request on a GPU; the tokens are
unchanged (the dummy rows are dropped) and each slot's cache is empty after load.

A shape is "run" when its binding exists (bound once per shape, and captured with it on the GPU): a request that adds
a binding would capture a graph mid-request there."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import specpack
from specpack.runtime.ngram_drafter import NgramConfig
from specpack.runtime.pack import Pack
from tests.runtime.test_cuda_backend import device_pack


def _bindings(pack: Pack) -> dict[str, set[tuple[Any, ...]]]:
    backend: Any = pack.backend
    engines = {"target": backend.target().engine, "draft": backend.draft().engine}
    return {label: {(i, *key) for i, slot in enumerate(e.slots) for key in slot.bindings} for label, e in engines.items()}


def _requests(pack: Pack, drafter: str) -> list[tuple[Any, int | None]]:
    """Prompts of several lengths (one past LONG_CHUNK + k_max + 1: chunks), every k and adaptive k."""
    rng = np.random.default_rng(3)
    prompts: list[Any] = ["def add(a, b):", [5], *(rng.integers(0, pack.manifest.vocab_size - 8, n).tolist()
                                                  for n in (7, 13, 45, 50))]
    return [(p, k) for p in prompts for k in (0, 1, 2, pack.manifest.k_max, None)]


def _check(pack_dir: Path, drafter: str) -> None:
    cpu = specpack.load(pack_dir, threads=1)
    dev = device_pack(pack_dir, slots=2, chunked_runs=True, precapture=True)
    try:
        assert all(slot.cache.length == 0 for slot in dev.backend.draft().engine.slots)  # type: ignore[attr-defined]
        before = _bindings(dev)
        assert before["target"] and before["draft"]
        for prompt, k in _requests(dev, drafter):
            want = cpu.generate(prompt, 24, k=k, drafter=drafter).tokens
            assert dev.generate(prompt, 24, k=k, drafter=drafter).tokens == want, (prompt, k)
        assert _bindings(dev) == before  # nothing new bound (captured, on a GPU) while requests ran
    finally:
        cpu.close()
        dev.close()


def test_a_model_pack_runs_no_new_shape_after_load(tiny_pack: Callable[..., tuple[Path, Path, Path]]) -> None:
    _check(tiny_pack("qwen2", "noisy", kv_cache="static", attention="gqa", head_dim=16, k=4)[0], "model")


def test_a_head_pack_runs_no_new_shape_after_load(tiny_head_pack: Callable[..., tuple[Path, Path, Path]]) -> None:
    _check(tiny_head_pack("qwen2", kv_cache="static")[0], "head")


@pytest.mark.parametrize("precapture", [False, True])
def test_without_precapture_a_request_binds_new_shapes(tiny_head_pack: Callable[..., tuple[Path, Path, Path]],
                                                       precapture: bool) -> None:
    """The check above can fail: the same requests on a backend that did not pre-capture bind shapes as they go."""
    dev = device_pack(tiny_head_pack("qwen2", kv_cache="static")[0], chunked_runs=True, precapture=precapture)
    try:
        before = _bindings(dev)
        dev.generate("def add(a, b):", 24, drafter="head")
        assert (_bindings(dev) != before) is not precapture
    finally:
        dev.close()


def test_a_tree_pack_precaptures_its_chains_and_keeps_its_tokens(tiny_export: Callable[..., Path]) -> None:
    """A tree pack (short_max T_max + 1 > k_max + 1): its chains run no new shape; trees keep their tokens."""
    pack_dir = tiny_export("qwen2", "small", k=4, max_len=64, kv_cache="static", max_tree_nodes=16)
    ngram = NgramConfig(1, 3, width=4)  # as tests/runtime/test_cuda_tree.py's packs
    cpu = specpack.load(pack_dir, threads=1, ngram=ngram)
    dev = device_pack(pack_dir, chunked_runs=True, precapture=True)
    dev = Pack(dev.path, dev.manifest, dev.tokenizer, dev.backend, ngram=ngram)
    try:
        before = _bindings(dev)
        for prompt, k in _requests(dev, "model")[:15]:  # prompts up to 13 tokens: max_len 64
            want = cpu.generate(prompt, 24, k=k, tree="off").tokens
            assert dev.generate(prompt, 24, k=k, tree="off").tokens == want, (prompt, k)
        assert _bindings(dev) == before
        repeated = "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n"  # prompt lookup drafts tries here
        got = dev.generate(repeated, 24, drafter="ngram", tree=4)
        assert got.tokens == cpu.generate(repeated, 24, drafter="ngram", tree=4).tokens and got.stats["proposed"]
    finally:
        cpu.close()
        dev.close()
