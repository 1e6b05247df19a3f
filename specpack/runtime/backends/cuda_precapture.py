"""Every greedy chain shape run at load, so that no CUDA graph is captured in the middle of a request.

ONNX Runtime captures a shape's graph on its second run (cuda.py, CAPTURE_RUNS): a shape first seen mid-request costs
several steps once. Run G measured 48-73 ms steps when adaptive k reached a head catch-up of a row count not seen
before (bench/README.md, "Run G"): adaptive k at 0.85 of k 2 where a replay of the same acceptance gave 0.96. As vLLM
captures its batch sizes at start-up, the backend runs each shape a chain step can take CAPTURE_RUNS times at load,
over a dummy request whose rows it drops afterwards:

    target    (n, k): a verify of k drafts over n rows; k = 0: n in 1 .. S and LONG_CHUNK (prefills and their
              chunks), k >= 1: n in k + 1 .. k_max + 1 (the last committed tokens, then k drafts)
    draft     n in 1 .. S and LONG_CHUNK (catch-ups and chunks)
    head      (C, 0) for C in 1 .. k_max + 1 and LONG_CHUNK (catch-ups), (0, 1) (a drafted row), on both halves of
              its hidden-state ping-pong

S is the engine's short_max: k_max + 1, or a tree pack's T_max + 1. Token trees' own runs (a verify of T nodes, a tree
head's runs) are not run here (up to 64 shapes per k: they capture on first use, docs/trees.md). Only the
greedy form captures; sampling runs are never captured. The rows written are garbage and dropped: each slot's cache
is empty afterwards, as at load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specpack.runtime.backends.cuda import CAPTURE_RUNS, LONG_CHUNK, DeviceDraft, DeviceTarget
from specpack.runtime.engine import VerifyRun
from specpack.runtime.state import DecodeState
from specpack.runtime.stats import DecodeStats
from specpack.sampling import SamplingParams, Uniforms

if TYPE_CHECKING:
    from specpack.runtime.backends.cuda_head import DeviceHead
    from specpack.runtime.device_buffers import DeviceStaticKVCache


def target_shapes(k_max: int, short_max: int) -> list[tuple[int, int]]:
    """(n, k) of every chain verify: n rows run, the last k of them drafts."""
    prefills = [(n, 0) for n in sorted({*range(1, short_max + 1), LONG_CHUNK})]
    return prefills + [(n, k) for k in range(1, k_max + 1) for n in range(k + 1, k_max + 2)]


def catch_up_rows(short_max: int) -> list[int]:
    """Row counts of the draft's (and the head's) catch-up runs: up to the engine's short_max, and a LONG_CHUNK chunk."""
    return sorted({*range(1, short_max + 1), LONG_CHUNK})


def _dummy_state(max_len: int, k_max: int, slot: int) -> DecodeState:
    params = SamplingParams()  # greedy: the captured form
    return DecodeState.start([0], 1, params, Uniforms(params, k_max), eos_ids=frozenset(), max_len=max_len,
                             k_max=k_max, stats=DecodeStats(k=k_max), slot=slot)


def _at(cache: DeviceStaticKVCache, length: int) -> None:
    """The cache holding `length` (garbage) rows: a length update and the mask's upload, nothing run."""
    cache.rollback(0)
    if length:
        cache.bind_inputs(length)
        cache.advance(length)


def _start(max_len: int) -> int:
    """The dummy request's cached length before each run: far enough from 0 and from max_len for every shape."""
    return max(0, min(64, max_len - 2 * LONG_CHUNK))


def precapture_target(target: DeviceTarget, max_len: int, k_max: int) -> int:
    """Runs every target_shapes shape CAPTURE_RUNS times on every slot; returns the runs."""
    runs, start = 0, _start(max_len)
    for i in range(len(target.slots)):
        state = _dummy_state(max_len, k_max, i)
        target.reset(state)
        cache = target.cache(i)
        for n, k in target_shapes(k_max, target.short_max):
            state.length = start + n - k  # the engine runs state.ids[cached : length + k]
            for _ in range(CAPTURE_RUNS):
                _at(cache, start)
                target.verify(VerifyRun(state, k, None))
                runs += 1
        cache.rollback(0)
    return runs


def precapture_draft(draft: DeviceDraft | DeviceHead, max_len: int, k_max: int) -> int:
    """Runs every draft (or head) chain shape CAPTURE_RUNS times on every slot; returns the runs."""
    from specpack.runtime.backends.cuda_head import DeviceHead

    runs, start = 0, _start(max_len)
    for i in range(len(draft.slots)):
        state = _dummy_state(max_len, k_max, i)
        draft.reset(state)
        cache = draft.cache(i)
        halves = (0, 1) if isinstance(draft, DeviceHead) else (0,)
        for half in halves:
            for c in catch_up_rows(draft.short_max):  # catch-ups: end <= committed (a head's first row is the cached token's)
                end = start + c + isinstance(draft, DeviceHead)
                state.length = end
                for _ in range(CAPTURE_RUNS):
                    _at(cache, start)
                    _set_half(draft, i, half)
                    draft.step(state, end, 0)
                    runs += 1
            if isinstance(draft, DeviceHead):  # a drafted row: the cache one row behind the committed length
                state.length = start + 1
                for _ in range(CAPTURE_RUNS):
                    _at(cache, start)
                    _set_half(draft, i, half)
                    draft.step(state, start + 2, 0)
                    runs += 1
        cache.rollback(0)
        _set_half(draft, i, 0)
    return runs


def _set_half(draft: DeviceDraft | DeviceHead, slot: int, half: int) -> None:
    """Which half of a head's hidden-state ping-pong the next run reads (part of its captured shape); a draft model
    has none."""
    from specpack.runtime.backends.cuda_head import DeviceHead

    if isinstance(draft, DeviceHead):
        draft.slots[slot].current = half
