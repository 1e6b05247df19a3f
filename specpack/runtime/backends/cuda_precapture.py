"""Every greedy shape a request can bind, run at load, so that no CUDA graph is captured in the middle of a request.

ONNX Runtime captures a shape's graph on its second run (cuda.py, CAPTURE_RUNS): a shape first seen mid-request costs
several steps once. Run G measured 48-73 ms steps when adaptive k reached a head catch-up of a row count not seen
before (bench/README.md, "Run G"): adaptive k at 0.85 of k 2 where a replay of the same acceptance gave 0.96. As vLLM
captures its batch sizes at start-up, the backend runs each shape a greedy step can take CAPTURE_RUNS times at load,
over a dummy request whose rows it drops afterwards. Chains:

    target    (n, k): a verify of k drafts over n rows; k = 0: n in 1 .. S and LONG_CHUNK (prefills and their
              chunks), k >= 1: n in k + 1 .. k_max + 1 (the last committed tokens, then k drafts)
    draft     n in 1 .. S and LONG_CHUNK (catch-ups and chunks)
    head      (C, 0) for C in 1 .. k_max + 1 and LONG_CHUNK (catch-ups), (0, 1) (a drafted row), on both halves of
              its hidden-state ping-pong

S is the engine's short_max: k_max + 1, or a tree pack's T_max + 1. A tree pack (a verify graph of the tree form,
`--max-tree-nodes T_max`) adds its trees' own runs (docs/trees.md):

    target      (T + 1, T) for T in k_max + 1 .. T_max: a tree verify of T nodes runs over the last committed token and
                its nodes (the target caches every committed token but the last between steps, runtime/loop.py), keyed
                as a chain verify of k = T; T <= k_max are chain shapes, above
    kv_compact  T in 2 .. T_max: kv_compact.onnx binds the verify's path [1, T + 1] (one graph per T, whatever the
                accepted path's length), and runs only where the path moves rows: never after one node (its path is
                empty or the identity), nor after a chain. Each run follows a verify of its T nodes (the mask and path
                it reads), as in a request
    head        a tree-form head's tree runs (head_tree.py): ("tree", C, 0) for C in 1 .. k_max + 1 and LONG_CHUNK,
                the catch-up of a proposal (C = the accepted nodes + 1; a longer one, after a path of more than k_max
                nodes, a prompt's first or one after T = 0 steps, goes as chunks of these: cuda_head.py), and
                ("tree", 0, W) for W in
                1 .. K, an expansion of W nodes at one depth (K: the head's tree width, at most T_max), each after a
                one-row catch-up (a replay), as at a tree's depth 2
    draft       a tree-form draft model's expansions (docs/trees.md, "Trees drafted by the draft model"): ("tree", W)
                for W in 1 .. K, each after a one-row catch-up (a chain step's shape: its catch-ups are the chain's)

Counted per slot for the GPU's tree packs (bench/gpu_head.py: k_max 8, T_max 16; a head's K 8): the chains' 54 verify
shapes (108 runs) and the head's 22 (44 runs), 76 shapes, as a chain head pack's 68 plus the prefills of 10 .. 17 rows;
the trees add 8 verify shapes and 15 kv_compact shapes (60 runs: T in 2 .. 16, a verify and a compaction each, twice;
the 14 verifies of T <= 8 replay chain shapes) and the head's 18 tree shapes (52 runs, 16 of them one-row catch-ups
replayed before an expansion): 41 shapes, 112 runs more per slot (a prompt-lookup tree pack, no head: 23 shapes, 60
runs). Not measured on a GPU: at Run H's rate (8.2 s for the head pack's 68 shapes on one slot, an H100) the trees would
add about 5 s per slot, an extrapolation.
Slots: every slot (CudaBackend.precapture_slots), but slot 0 alone where a pack with batched graphs is loaded for
several rows (BackendOptions.slots > 1): there the batched engines decode every row of a batch (docs/batching.md, "On
the GPU"), and the per-slot engines serve a lone request (slot 0) and a sampling row's drafts (never captured), so the
other slots' shapes would only cost load time (at 64 slots, minutes).
Batched engines (docs/batching.md, "On the GPU"; precapture_batched): ONNX Runtime keeps captured graphs per thread, so
what the load captured serves the loading thread's requests (Pack.generate) alone; a batcher runs this, or (per-slot
verifies, max_batch 1) the chains above again, on its own thread before its first step (CudaBackend.precapture_thread):

    target    its verify graph's greedy form over slots [0, B) for every span B (BatchedRuns.span: the powers of two
              below the engines' slots, and the slots), K in 0 .. k_max drafts at most a row (uniforms [B, K + 1]) over
              S = max(MIN_WIDTH, K + 1) new tokens a row, and K = 0 over S in MIN_WIDTH + 1 .. k_max + 1 (prefills
              proper of a prompt's last few tokens); the same shapes on its plain form (graphs/batched_plain_form.py)
              where the backend opened one, by a temperature-only sampling row (K = k_max: batched_verify.py), with
              a host one-hot q and with the draft model's q in place (two bindings per shape)
    draft     the batched draft's graph over the same spans, S in MIN_WIDTH .. k_max + 1 (its decode steps and short
              catch-ups)

At 64 slots and k_max 8: 7 spans x (16 target + 32 plain + 8 draft) shapes (784 runs), not measured on a GPU.
Per slot, only the greedy form is pre-captured (a plain sampling request's per-slot shapes are captured on first use);
runs of the graphs as exported are never captured. The rows written are garbage and dropped: each slot's
caches are empty afterwards, as at load (the features cache of a head pack holds garbage rows, as after any request:
the verify writes a row's features before the head reads it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from specpack.runtime.backends.cuda import CAPTURE_RUNS, LONG_CHUNK, DeviceDraft, DeviceTarget
from specpack.runtime.batched_target import MIN_WIDTH, BatchedRuns
from specpack.runtime.engine import HeadTreeRun, VerifyRun
from specpack.runtime.state import DecodeState, Proposal
from specpack.runtime.stats import DecodeStats
from specpack.sampling import SamplingParams, Uniforms

if TYPE_CHECKING:
    from specpack.runtime.backends.cuda_head import DeviceHead
    from specpack.runtime.batched_draft import BatchedGreedyDrafter
    from specpack.runtime.device_buffers import DeviceStaticKVCache

# a tree verify's accepted nodes that move rows (node 1, the root's second child): keep_rows runs kv_compact.onnx
_THROUGH_A_SIBLING = np.array([1], np.int64)


def target_shapes(k_max: int, short_max: int) -> list[tuple[int, int]]:
    """(n, k) of every chain verify: n rows run, the last k of them drafts."""
    prefills = [(n, 0) for n in sorted({*range(1, short_max + 1), LONG_CHUNK})]
    return prefills + [(n, k) for k in range(1, k_max + 1) for n in range(k + 1, k_max + 2)]


def tree_shapes(k_max: int, tree_nodes: int) -> list[tuple[int, int]]:
    """(n, T) of every tree verify target_shapes lacks: the last committed token and T > k_max nodes."""
    return [(t + 1, t) for t in range(k_max + 1, tree_nodes + 1)]


def compacted_nodes(tree_nodes: int) -> list[int]:
    """T of every kv_compact.onnx run: after a tree of T >= 2 nodes (one node's path never moves a row)."""
    return list(range(2, tree_nodes + 1))


def catch_up_rows(short_max: int) -> list[int]:
    """Row counts of the draft's (and the head's) catch-up runs: up to the engine's short_max, and a LONG_CHUNK chunk."""
    return sorted({*range(1, short_max + 1), LONG_CHUNK})


def _dummy_state(max_len: int, k_max: int, slot: int, params: SamplingParams | None = None) -> DecodeState:
    """params: greedy by default (the greedy form); SamplingParams(1.0) for the plain sampling form (its uniforms
    drawn)."""
    params = params or SamplingParams()
    uniforms = Uniforms(params, k_max, seed=0)
    uniforms.draw(k_max)
    return DecodeState.start([0], 1, params, uniforms, eos_ids=frozenset(), max_len=max_len, k_max=k_max,
                             stats=DecodeStats(k=k_max), slot=slot)


def _at(cache: DeviceStaticKVCache, length: int) -> None:
    """The cache holding `length` (garbage) rows: a length update and the mask's upload, nothing run."""
    cache.rollback(0)
    if length:
        cache.bind_inputs(length)
        cache.advance(length)


def _start(max_len: int, rows: int) -> int:
    """The dummy request's cached length before each run: far enough from 0 and from max_len for every shape, a chunk
    of LONG_CHUNK rows or the engine's longest other run, `rows` (a tree pack's T_max + 1 may be the longer)."""
    return max(0, min(64, max_len - max(2 * LONG_CHUNK, rows + 1)))


def precapture_target(target: DeviceTarget, max_len: int, k_max: int) -> int:
    """Runs every target_shapes shape CAPTURE_RUNS times on every slot, and a tree pack's tree shapes
    (precapture_tree_target); returns the runs."""
    runs, start = 0, _start(max_len, target.short_max)
    for i in range(target.backend.precapture_slots):
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
    if target.tree_nodes:
        runs += precapture_tree_target(target, max_len, k_max)
    return runs


def precapture_tree_target(target: DeviceTarget, max_len: int, k_max: int) -> int:
    """Runs every tree_shapes verify and every compacted_nodes kv_compact.onnx shape CAPTURE_RUNS times on every slot,
    each compaction right after a verify of its T nodes (the mask and path it reads); returns the runs."""
    runs, start = 0, _start(max_len, target.short_max)
    nodes = sorted({t for _, t in tree_shapes(k_max, target.tree_nodes)} | set(compacted_nodes(target.tree_nodes)))
    for i in range(target.backend.precapture_slots):
        state = _dummy_state(max_len, k_max, i)
        target.reset(state)
        cache = target.cache(i)
        state.length = start + 1  # the last committed token is not cached: the verify runs it and the T nodes
        for t in nodes:
            parents = np.full(t, -1, np.int64)  # [T] every node a root child: any tree of T nodes binds these shapes
            for _ in range(CAPTURE_RUNS):
                _at(cache, start)
                target.verify_tree(VerifyRun(state, t, None, parents))
                runs += 1
                if t >= 2:
                    cache.keep_rows(state.length, _THROUGH_A_SIBLING)  # kv_compact.onnx over the verify's path
                    runs += 1
        cache.rollback(0)
    return runs


def precapture_draft(draft: DeviceDraft | DeviceHead, max_len: int, k_max: int) -> int:
    """Runs every draft (or head) chain shape CAPTURE_RUNS times on every slot, and a tree-form head's tree runs
    (precapture_head_tree); returns the runs."""
    from specpack.runtime.backends.cuda_head import DeviceHead

    runs, start = 0, _start(max_len, draft.short_max)
    for i in range(draft.backend.precapture_slots):
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
    if isinstance(draft, DeviceHead) and draft.tree_width:
        runs += precapture_head_tree(draft, max_len, k_max)
    if isinstance(draft, DeviceDraft) and draft.tree_width:
        runs += precapture_draft_tree(draft, max_len, k_max)
    return runs


def precapture_draft_tree(draft: DeviceDraft, max_len: int, k_max: int) -> int:
    """Runs a tree-form draft model's expansions of W in 1 .. K own rows CAPTURE_RUNS times on every slot, each after a
    one-row catch-up (a chain step's shape, captured above; a tree's first run); returns the runs."""
    runs, start = 0, _start(max_len, draft.short_max + draft.tree_width)
    for i in range(draft.backend.precapture_slots):
        state = _dummy_state(max_len, k_max, i)
        draft.reset(state)
        cache = draft.cache(i)
        state.length = start + 1  # a catch-up of one row, then W own rows at depth 1 reading it
        runs += _expansions(draft, state, cache, start)
        cache.rollback(0)
    return runs


def precapture_head_tree(head: DeviceHead, max_len: int, k_max: int) -> int:
    """Runs a tree-form head's tree runs CAPTURE_RUNS times on every slot: catch-ups of C <= short_max rows and of a
    LONG_CHUNK chunk (the captured ones), and expansions of W in 1 .. K own rows, each after a one-row catch-up (a
    tree's first run: its buffers' run index starts again there); returns the runs."""
    runs, start = 0, _start(max_len, head.short_max + head.tree_width)
    for i in range(head.backend.precapture_slots):
        state = _dummy_state(max_len, k_max, i)
        head.reset(state)
        cache = head.cache(i)
        for c in catch_up_rows(head.short_max):
            state.length = start + c + 1  # the catch-up runs rows start .. length - 2 (end <= committed)
            for _ in range(CAPTURE_RUNS):
                _at(cache, start)
                head.tree_step(state, None)
                runs += 1
        state.length = start + 2  # a catch-up of one row, then W own rows at depth 2 reading it
        runs += _expansions(head, state, cache, start)
        cache.rollback(0)
    return runs


def _expansions(engine: DeviceDraft | DeviceHead, state: DecodeState, cache: DeviceStaticKVCache, start: int) -> int:
    """A tree-form engine's expansions of W in 1 .. K own rows, CAPTURE_RUNS times each, each after a one-row catch-up
    (a tree's first run: its buffers' run index starts again there); returns the runs."""
    runs = 0
    for w in range(1, engine.tree_width + 1):
        run = HeadTreeRun(tokens=np.zeros(w, np.int64), hidden=np.zeros(w, np.int64), position=start + 1,
                          committed=start + 1, ancestors=np.zeros((w, 0), np.int64))
        for _ in range(CAPTURE_RUNS):
            _at(cache, start)
            engine.tree_step(state, None)
            engine.tree_step(state, run)
            runs += 2
    return runs


def _set_half(draft: DeviceDraft | DeviceHead, slot: int, half: int) -> None:
    """Which half of a head's hidden-state ping-pong the next run reads (part of its captured shape); a draft model
    has none."""
    from specpack.runtime.backends.cuda_head import DeviceHead

    if isinstance(draft, DeviceHead):
        draft.slots[slot].current = half


def batched_spans(slots: int) -> list[int]:
    """B of every slot range [0, B) a batched decode step covers (BatchedRuns.span): the powers of two below `slots`,
    and `slots`."""
    return sorted({*(1 << n for n in range(slots.bit_length()) if 1 << n < slots), slots})


def precapture_batched(target: BatchedRuns, drafter: BatchedGreedyDrafter | None, max_len: int, k_max: int,
                       q_of: Callable[[DecodeState, int], Any] | None = None) -> int:
    """Runs every decode step shape of the batched engines CAPTURE_RUNS times (module docstring): a greedy verify of
    K drafts, the same by a temperature-only sampling row where the verify graph has a plain form (its deterministic
    proposal's one-hot q, and with q_of (the draft model's q rows of a slot: DeviceDraft.q) a q in place, as the
    model's sampling rows run: graphs/batched_plain_form.py, batched_verify.py), and the draft's S fed tokens, by one
    dummy row in the span's last slot (the others pad rows, as in a step); every slot's cached length is 0 again
    afterwards. Returns the runs."""
    runs = 0
    # (params, whether q is in place): greedy; a deterministic sampling proposal's host q; a model's q in place
    modes: list[tuple[SamplingParams, bool]] = [(SamplingParams(), False)]
    if getattr(target.caches, "plain_session", None) is not None:
        modes += [(SamplingParams(1.0), False), *([(SamplingParams(1.0), True)] if q_of is not None else [])]
    for span in batched_spans(target.slots):
        slot = span - 1
        # (uncached committed tokens, drafts): a verify of k drafts after one token runs k + 1 rows; a prefill of n
        verifies = [(1, k) for k in range(k_max + 1)] + [(n, 0) for n in range(MIN_WIDTH + 1, k_max + 2)]
        for params, in_place in modes:
            state = _dummy_state(max_len, k_max, slot, params)
            for length, k in verifies:
                state.length = length
                q = q_of(state, k) if in_place and q_of is not None else None
                proposal = Proposal(tokens=state.ids[length : length + k], q=q)
                for _ in range(CAPTURE_RUNS):
                    target.lengths[slot] = 0
                    target.verify_rows([(state, proposal)])
                    runs += 1
        target.lengths[slot] = 0
        if drafter is None:
            continue
        for seq in range(MIN_WIDTH, k_max + 2):
            for _ in range(CAPTURE_RUNS):
                drafter.engine.run({slot: state.ids[:seq]})
                runs += 1
    return runs
