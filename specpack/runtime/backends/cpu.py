"""The `cpu` backend: ONNX Runtime's CPU EP over host buffers allocated once (docs/architecture.md, "Backends").

    OrtBackend
      OrtTarget  the VerifyEngine of verify.onnx: one KV cache per slot (static or concat, by the graph's
                 form), n_accepted / next_token [1] per slot
      OrtDraft   the DraftEngine of draft_step.onnx (opened on first use; at load for a pinned pack): a cache,
                 q [1, k_max, V] and token [1] per slot; a tree pack's draft model in its tree form also runs token
                 trees' rows (tree_step: docs/trees.md, "Trees drafted by the draft model")
    The verify and draft policy above them (pad rows, one-hot q, rollback) is runtime/target.py's.

Every input is a view bound by pointer (IOBinding): input_ids is state.ids[None, cached:end], the drafts
already in place; position_ids and attention_mask are views of constants; past and present are the
cache's views; q is the draft's buffer, read by the verify as it was written. position_ids are fed only to
graphs that take them (the manifest's `positions`: "internal" graphs compute them from the static mask). Per step the host reads
back two integers from the verify and one per draft, never logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specpack import names
from specpack.contract.manifest import BatchedForm, HeadEntry, Manifest, ModelEntry
from specpack.contract.verified_read import GraphBytes, graph_bytes
from specpack.errors import SpecpackError
from specpack.limits import numpy_dtype
from specpack.runtime.backend import BackendOptions
from specpack.runtime.engine import (
    HeadTreeRun,
    TopRows,
    TreeResult,
    VerifyRun,
    feature_buffer_shape,
    head_rows,
    tree_refusal,
)
from specpack.runtime.graph_check import check_graph_matches
from specpack.runtime.head_tree_rows import HeadTreeBuffers, draft_tree_buffers
from specpack.runtime.kv_cache import ConcatKVCache, KVCache
from specpack.runtime.ort_session import OrtGraph
from specpack.runtime.state import DecodeState, VerifyResult
from specpack.runtime.static_kv_cache import StaticKVCache
from specpack.runtime.target import EngineBackend

if TYPE_CHECKING:
    from specpack.runtime.backends.cpu_batched import BatchedEngines


def load(path: Path, manifest: Manifest, options: BackendOptions) -> OrtBackend:
    return OrtBackend(path, manifest, options)


@dataclass(frozen=True)
class Constants:
    """Read-only inputs shared by every slot and both models."""

    positions: np.ndarray   # int64 [1, max_len + k_max + 1]  0, 1, 2, ... (position_ids are views)
    mask: np.ndarray        # int64 [1, max_len + k_max + 1]  all ones (attention_mask is a view)
    zero_q: np.ndarray      # fp32 [1, k_max, V]               draft_probs of a verify that reads no q (views)

    @classmethod
    def allocate(cls, width: int, k_max: int, vocab_size: int) -> Constants:
        return cls(positions=np.arange(width, dtype=np.int64)[None, :], mask=np.ones((1, width), np.int64),
                   zero_q=np.zeros((1, k_max, vocab_size), np.float32))


class _OrtModel:
    """What both engines share: per slot a cache and an IOBinding; bind ids[cached:end] and run."""

    def __init__(self, graph: OrtGraph, caches: list[KVCache], constants: Constants, positions: bool = True) -> None:
        """positions: feed position_ids (the manifest's graph `positions` is "inputs")."""
        self.graph, self.caches, self.constants, self.positions = graph, caches, constants, positions
        self._bindings = [graph.new_binding() for _ in caches]

    def cache(self, slot: int) -> KVCache:
        return self.caches[slot]

    def reset(self, state: DecodeState) -> None:
        self.caches[state.slot].reset()

    def close(self) -> None:
        self.graph.close()

    def _run(self, state: DecodeState, end: int, extra_inputs: dict[str, np.ndarray],
             extra_outputs: dict[str, np.ndarray]) -> None:
        cache, c = self.caches[state.slot], self.constants
        start = cache.length
        inputs = {
            names.INPUT_IDS: state.ids[None, start:end],          # [1, S]
            **state.sampling_inputs,                              # [1] each
            **cache.bind_inputs(end - start),                     # past [1, H, L, D] each (and lengths, by form)
            **extra_inputs,
        }
        if self.positions:
            inputs[names.POSITION_IDS] = c.positions[:, start:end]  # [1, S]
        if names.ATTENTION_MASK not in inputs:
            inputs[names.ATTENTION_MASK] = c.mask[:, :end]       # [1, L + S]
        self.graph.run(self._bindings[state.slot], inputs, {**cache.bind_outputs(end - start), **extra_outputs})
        cache.advance(end - start)


class OrtDraft(_OrtModel):
    """The DraftEngine of draft_step.onnx: S new tokens in, one drawn token and its distribution q out. In the draft's
    tree form (a tree pack's draft model: docs/trees.md, "Trees drafted by the draft model") also a TreeDraftEngine:
    a chain step binds no own row (W = 0: the chain form's rows, bit for bit), `tree_step` a token tree's runs."""

    def __init__(self, graph: OrtGraph, caches: list[KVCache], constants: Constants, k_max: int, vocab_size: int,
                 positions: bool = True, tree: HeadTreeBuffers | None = None) -> None:
        """tree: the tree form's buffers (hidden 0; None: a chain draft)."""
        super().__init__(graph, caches, constants, positions)
        self._q = [np.zeros((1, k_max, vocab_size), np.float32) for _ in caches]  # [1, k_max, V] per slot
        self._token = [np.zeros(1, np.int64) for _ in caches]                     # [1] per slot
        self.tree = tree
        self.tree_width = 0 if tree is None else tree.width  # K; 0: chains only

    def step(self, state: DecodeState, end: int, row: int) -> int:
        token, q = self._token[state.slot], self._q[state.slot]
        inputs: dict[str, np.ndarray] = {names.UNIFORM: state.uniforms.draft[row : row + 1]}  # [1]
        outputs: dict[str, np.ndarray] = {names.TOKEN: token, names.PROBS: q[:, row]}         # [1], [1, V]
        if self.tree is not None:  # the tree form run as a chain: no own row, the last row's top-K (unread)
            inputs.update(self.tree.chain_inputs(state.slot, end, 0))
            outputs.update(self.tree.outputs(state.slot, 0, 0))
        self._run(state, end, inputs, outputs)
        return int(token[0])

    def tree_step(self, state: DecodeState, run: HeadTreeRun | None) -> TopRows:
        """A token tree's run (engine.TreeDraftEngine): run None, the catch-up over the committed tokens not yet cached
        (its last row's top-K: the root's children); else `run`'s own rows, one per node expanded, its tokens written
        into state.ids at their cache rows (past the committed ones: the proposal overwrites them)."""
        tree = self.tree
        if tree is None:
            raise tree_refusal("this pack's draft model (exported without the tree form)")
        slot, start = state.slot, self.caches[state.slot].length
        index = tree.next_run(slot, run)
        if run is None:
            end, w = state.length, 0
            own = tree.chain_inputs(slot, end, 0)
        else:
            end, w = start + len(run.tokens), len(run.tokens)
            state.ids[start:end] = run.tokens
            own = tree.row_inputs(slot, run, start)
        self._run(state, end, {names.UNIFORM: state.uniforms.draft[:1], **own},  # the drawn token is not read
                  {names.TOKEN: self._token[slot], names.PROBS: self._q[slot][:, 0], **tree.outputs(slot, index, w)})
        return tree.top_rows(slot, index, w, start if w else end - 1)

    def q(self, state: DecodeState, k: int) -> np.ndarray:
        return self._q[state.slot][:, :k]  # [1, k, V]


class OrtTarget(_OrtModel):
    """The VerifyEngine of verify.onnx: committed tokens not yet cached + k drafts in; n accepted and the next
    token out (and, in a head pack, each row's target_features, written at its position: docs/heads.md)."""

    def __init__(self, graph: OrtGraph, caches: list[KVCache], constants: Constants, positions: bool = True,
                 features: list[np.ndarray] | None = None, tree_nodes: int = 0) -> None:
        """features: per slot the rows a head reads, [1, max_len + k_max + 1, F] (a concat graph's output rows written
        at their positions) or [1, 1, max_len, F] (a static graph's features cache, written in place); None: the graph
        has no features; tree_nodes: the tree form's most nodes (0: the chain form; docs/trees.md)."""
        super().__init__(graph, caches, constants, positions)
        self._outputs = [{names.N_ACCEPTED: np.zeros(1, np.int64), names.NEXT_TOKEN: np.zeros(1, np.int64)}
                         for _ in caches]  # [1] each, per slot
        self.features = features
        self.tree_nodes = tree_nodes
        self._chain = np.arange(-1, tree_nodes - 1, dtype=np.int64)[None]  # [1, T_max] parents of a chain
        self._path = [np.zeros((1, tree_nodes + 1), np.int64) for _ in caches]  # [1, T_max + 1] per slot

    def verify(self, run: VerifyRun) -> VerifyResult:
        if self.tree_nodes:  # the tree form verifies a chain as a tree of width 1 (its head has no draft_probs)
            path = self._run_tree(run, self._chain[:, : run.k])
            return VerifyResult(len(path), int(self._outputs[run.state.slot][names.NEXT_TOKEN][0]))
        state, k = run.state, run.k
        q = self.constants.zero_q[:, :k] if run.q is None else run.q  # [1, k, V]
        outputs = self._run_verify(state, k, {names.DRAFT_PROBS: q}, {})
        return VerifyResult(int(outputs[names.N_ACCEPTED][0]), int(outputs[names.NEXT_TOKEN][0]))

    def verify_tree(self, run: VerifyRun) -> TreeResult:
        if not self.tree_nodes or run.parents is None:
            raise tree_refusal("this pack's verify graph (exported without --max-tree-nodes)")
        path = self._run_tree(run, run.parents[None])
        if self.features is not None:  # a head pack's features cache: the accepted path's rows, like the KV rows
            keep_feature_rows(self.features[run.state.slot], run.state.length, path)
        return TreeResult(path, int(self._outputs[run.state.slot][names.NEXT_TOKEN][0]))

    def _run_tree(self, run: VerifyRun, parents: np.ndarray) -> np.ndarray:
        """The tree form over `parents` [1, T]; the accepted nodes (path rows 1..n, minus one: node indices)."""
        state, k = run.state, run.k
        if k > self.tree_nodes:
            raise tree_refusal(f"a verify of {k} nodes (this pack's tree form takes {self.tree_nodes} at most)")
        path = self._path[state.slot][:, : k + 1]  # [1, T + 1]
        outputs = self._run_verify(state, k, {names.PARENTS: parents}, {names.PATH: path})
        n = int(outputs[names.N_ACCEPTED][0])
        return path[0, 1 : n + 1] - 1  # [n] node indices, increasing

    def _run_verify(self, state: DecodeState, k: int, extra_inputs: dict[str, np.ndarray],
                    extra_outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run over state.ids[cached : length + k] with the uniforms [1, k + 1]; the outputs (n_accepted, next_token)."""
        outputs = {**self._outputs[state.slot], **extra_outputs}
        features = None if self.features is None else self.features[state.slot]
        if features is not None and features.ndim == 4:  # the static features cache: past bound as present
            outputs[names.TARGET_FEATURES] = extra_inputs[names.PAST_TARGET_FEATURES] = features
        elif features is not None:  # row r of this run is position cached + r; valid below the cache's length
            start = self.caches[state.slot].length
            outputs[names.TARGET_FEATURES] = features[:, start : state.length + k]
        self._run(state, state.length + k, {names.UNIFORMS: state.uniforms.verify[:, : k + 1], **extra_inputs},
                  outputs)  # uniforms [1, k+1]
        return outputs

    def upload_q(self, slot: int, host_q: np.ndarray, k: int) -> np.ndarray:
        return host_q[:, :k]  # [1, k, V]: the host buffer is what the session reads


def keep_feature_rows(features: np.ndarray, start: int, path: np.ndarray) -> None:
    """A head pack's features cache [1, 1, M, F] after a tree verify: rows start + path[i] -> start + i (node i's row
    is start + i, as in Target._tree's KV move; a gather: the sources are read first). kv_compact.onnx on a device."""
    if len(path):
        features[0, 0, start : start + len(path)] = features[0, 0, start + path]


class OrtHead(_OrtModel):
    """The DraftEngine of head_step.onnx (docs/heads.md, "How the runtime binds it"): a draft head over the target's
    features, its own one-layer concat cache; a step predicts the token at position `end`.

    Head row t reads (feature g_t, token x_{t+1}) and predicts x_{t+2}. A step whose rows all have target features
    (end <= state.length) runs the catch-up rows t = cached .. end - 2 from the features the verify wrote; a step past
    them (end > state.length) runs one drafted row t = end - 2 from the head's own last output (hidden_out)."""

    def __init__(self, graph: OrtGraph, caches: list[KVCache], constants: Constants, features: list[np.ndarray],
                 k_max: int, vocab_size: int, hidden: int, dtype: np.dtype, tree: HeadTreeBuffers | None = None) -> None:
        """features: the target engine's (a static head reads the whole features cache [1, 1, M, F] and takes its
        rows in the graph; a concat head the rows [cached, cached + C) of [1, width, F]); tree: a tree-form head's
        buffers (None: a chain head)."""
        super().__init__(graph, caches, constants, positions=False)  # the head computes its positions itself
        self.features = features
        self._q = [np.zeros((1, k_max, vocab_size), np.float32) for _ in caches]  # [1, k_max, V] per slot
        self._token = [np.zeros(1, np.int64) for _ in caches]                     # [1] per slot
        self._hidden = [np.zeros((2, 1, 1, hidden), dtype) for _ in caches]       # [in | out, 1, 1, H] per slot
        self._current = [0] * len(caches)                                          # which half holds hidden_in
        self.tree = tree
        self.tree_width = 0 if tree is None else tree.width

    def step(self, state: DecodeState, end: int, row: int) -> int:
        slot, ids = state.slot, state.ids
        cache, hidden, current = self.caches[slot], self._hidden[slot], self._current[slot]
        start = cache.length
        c, w = head_rows(start, end, state.length)
        inputs = {
            names.INPUT_IDS: ids[None, start + 1 : start + 1 + c],              # [1, C]
            names.FEATURES: _feature_rows(self.features[slot], start, c),       # [1, C, F] or [1, 1, M, F]
            names.DRAFT_IDS: ids[None, end - 1 : end - 1 + w],                  # [1, W]
            names.HIDDEN_IN: hidden[current][:, :w],                            # [1, W, H]
            names.UNIFORM: state.uniforms.draft[row : row + 1],                 # [1]
            **state.sampling_inputs,                                            # [1] each
            **cache.bind_inputs(c + w),                                         # past [1, H_kv, L, D]
        }
        outputs = {names.TOKEN: self._token[slot], names.PROBS: self._q[slot][:, row],  # [1], [1, V]
                   names.HIDDEN_OUT: hidden[1 - current], **cache.bind_outputs(c + w)}  # [1, 1, H], present
        if self.tree is not None:  # a chain through the tree form: own rows at their cache rows, causal
            inputs.update(self.tree.chain_inputs(slot, start + c, w))
            outputs.update(self.tree.outputs(slot, 0, w))
        self.graph.run(self._bindings[slot], inputs, outputs)
        cache.advance(c + w)
        self._current[slot] = 1 - current  # this run's output is the next drafted row's input
        return int(self._token[slot][0])

    def tree_step(self, state: DecodeState, run: HeadTreeRun | None) -> TopRows:
        """A token tree's run (engine.TreeDraftEngine): the catch-up (run None) or `run`'s own rows."""
        tree = self.tree
        if tree is None:
            raise tree_refusal("this pack's draft head (exported without --max-tree-nodes)")
        slot = state.slot
        cache = self.caches[slot]
        start = cache.length
        index = tree.next_run(slot, run)
        if run is None:  # the catch-up: rows t = start .. length - 2 from target features, no own row
            c, w = state.length - 1 - start, 0
            own = {**tree.chain_inputs(slot, start + c, 0), names.DRAFT_IDS: state.ids[None, :0],  # [1, 0]
                   names.HIDDEN_IN: tree.hidden_in[slot][:, :0]}                                  # [1, 0, H]
        else:
            c, w = 0, len(run.tokens)
            own = tree.own_inputs(slot, run, start)
        inputs = {
            names.INPUT_IDS: state.ids[None, start + 1 : start + 1 + c],                        # [1, C]
            names.FEATURES: self.features[slot],                                                 # [1, 1, M, F]
            names.UNIFORM: state.uniforms.draft[:1],                                             # [1] (unread)
            **own, **state.sampling_inputs, **cache.bind_inputs(c + w),
        }
        outputs = {names.TOKEN: self._token[slot], names.PROBS: self._q[slot][:, 0],
                   names.HIDDEN_OUT: self._hidden[slot][0], **tree.outputs(slot, index, w), **cache.bind_outputs(c + w)}
        self.graph.run(self._bindings[slot], inputs, outputs)
        cache.advance(c + w)
        return tree.top_rows(slot, index, w, start if w else start + c - 1)

    def q(self, state: DecodeState, k: int) -> np.ndarray:
        return self._q[state.slot][:, :k]  # [1, k, V]


def _feature_rows(features: np.ndarray, start: int, count: int) -> np.ndarray:
    """What a head's `features` input binds: the whole static cache [1, 1, M, F] (the graph takes its rows), or the
    concat form's rows [start, start + count) of [1, width, F]."""
    return features if features.ndim == 4 else features[:, start : start + count]


class OrtBackend(EngineBackend[OrtTarget, OrtDraft | OrtHead]):
    """Both engines on ONNX Runtime with host buffers; the draft's session opens on first use."""

    name = "cpu"
    providers: tuple[str, ...] = ("CPUExecutionProvider",)

    def __init__(self, path: Path, manifest: Manifest, options: BackendOptions) -> None:
        self.path, self.manifest, self.options = path, manifest, options
        m = manifest
        if self.name == "cpu":
            _check_cpu_dtypes(m)
        width = m.max_len + m.k_max + 1
        self.constants = Constants.allocate(width, m.k_max, m.vocab_size)
        self.features = None if m.head is None else [  # per slot: what the verify wrote for the head
            np.zeros(feature_buffer_shape(m), numpy_dtype(m.target.dtype)) for _ in range(options.slots)]
        tree = m.target.graph.tree
        if tree is not None and tree.max_nodes < m.k_max:
            raise SpecpackError("this pack's tree verify graph takes fewer nodes than its k_max",
                                expected=f"--max-tree-nodes >= --k ({m.k_max})", found=f"max_nodes {tree.max_nodes}",
                                hint="re-export with --max-tree-nodes at least --k")
        target = OrtTarget(self._graph(m.target), self._caches(m.target), self.constants, _feeds_positions(m.target),
                           self.features, 0 if tree is None else tree.max_nodes)
        drafts = m.draft_model is not None or m.head is not None
        super().__init__(target, self._open_draft if drafts else None, k_max=m.k_max,
                         vocab_size=m.vocab_size, pad_single_steps=options.pad_single_steps,
                         open_draft_now=options.verified_reads)  # pinned: nothing is read after load

    def _open_draft(self) -> OrtDraft | OrtHead:
        m = self.manifest
        if m.head is not None and self.features is not None:
            head, dtype = m.head, numpy_dtype(m.head.dtype)
            caches: list[KVCache] = [
                StaticKVCache(1, head.kv_heads, head.head_dim, m.max_len, dtype) if head.graph.kv_cache == "static"
                else ConcatKVCache(1, head.kv_heads, head.head_dim, m.max_len + m.k_max + 1, dtype)
                for _ in range(self.options.slots)]
            tree = None if not head.tree_width or m.target.graph.tree is None else HeadTreeBuffers(
                self.options.slots, head.tree_width, m.target.graph.tree.max_nodes + 1, m.max_len, head.hidden, dtype)
            return OrtHead(self._graph(head), caches, self.constants, self.features, m.k_max, m.vocab_size, head.hidden,
                           dtype, tree)
        return OrtDraft(self._graph(m.draft), self._caches(m.draft), self.constants, m.k_max, m.vocab_size,
                        _feeds_positions(m.draft), draft_tree_buffers(m, self.options.slots))

    def batched_engines(self, max_batch: int) -> BatchedEngines | None:
        """The pack's batched graphs (spec-export --max-batch) opened for up to max_batch rows: the batched target
        and, with a draft model, the batched greedy drafter (cpu_batched.py); None for a pack without them."""
        from specpack.runtime.backends.cpu_batched import open_batched

        return open_batched(self.manifest, max_batch, lambda _, form: self._graph(form))  # host caches

    def _graph(self, entry: ModelEntry | HeadEntry | BatchedForm) -> OrtGraph:
        source: Path | GraphBytes = self.path / entry.graph.path
        if self.options.verified_reads:
            source = graph_bytes(self.path, self.manifest, entry.graph)
        graph = OrtGraph(source, threads=self.options.threads, providers=list(self.providers))
        check_graph_matches(entry.graph, graph.session, entry.graph.path)  # the manifest's I/O sizes every buffer
        return graph

    def _caches(self, entry: ModelEntry) -> list[KVCache]:
        return [host_cache(entry, self.manifest.max_len, self.manifest.k_max) for _ in range(self.options.slots)]


def _feeds_positions(entry: ModelEntry) -> bool:
    """Whether the runtime feeds the graph position_ids: the manifest says (and the session was checked to
    take exactly the inputs the manifest lists)."""
    return names.POSITION_IDS in entry.graph.runtime_inputs()


def host_cache(entry: ModelEntry, max_len: int, k_max: int) -> KVCache:
    """The host KV cache of the form the model's graph was exported in (the manifest's `kv_cache`):
    static buffers [1, H, max_len, D] written in place, or concat ping-pong buffers."""
    dtype = numpy_dtype(entry.dtype)
    if entry.graph.kv_cache == "static":  # a request never runs past max_len (prompt + max_new_tokens <= max_len)
        return StaticKVCache(entry.num_layers, entry.kv_heads, entry.head_dim, max_len, dtype)
    return ConcatKVCache(entry.num_layers, entry.kv_heads, entry.head_dim, max_len + k_max + 1, dtype)


def _check_cpu_dtypes(m: Manifest) -> None:
    """Graphs the model builder built for CUDA are not the CPU's; bf16 graphs never run on the CPU EP (it has no
    bf16 kernels for them: ONNX Runtime would fail to load the graph with a NOT_IMPLEMENTED node); fp16 graphs only
    where it has fast fp16 kernels (runtime/cpu_fp16.py)."""
    from specpack.runtime.cpu_fp16 import cpu_fp16_refusal

    if cuda := [role for role, entry in m.models() if entry.graph.execution_provider == "cuda"]:
        raise SpecpackError("this pack's graphs were built for the CUDA execution provider",
                            expected="graphs for the CPU (spec-export --graphs torch, or --graphs builder --ep cpu)",
                            found=f"{' and '.join(cuda)}: exporter builder, execution_provider cuda",
                            hint="run it with --device cuda, or re-export with --graphs builder --ep cpu --dtype fp32")
    if bf16 := [role for role, entry in m.models() if entry.dtype == "bf16"]:
        raise SpecpackError("this bf16 pack cannot run on the CPU", expected="an fp32 pack for --device cpu",
                            found=f"bf16 {' and '.join(bf16)} graphs: ONNX Runtime's CPU execution provider has no "
                                  "bf16 kernels for them",
                            hint="run it on a GPU (--device cuda), or re-export with --dtype fp32 (int4 / int8 "
                                 "weights for speed)")

    if any(entry.dtype == "fp16" for _, entry in m.models()) and (why := cpu_fp16_refusal()):
        raise SpecpackError("this fp16 pack has no fast kernels on this CPU", expected="an fp32 pack on this CPU "
                            "(with int4 / int8 weights for speed)", found=why,
                            hint="re-export with --dtype fp32 --quantize-target int4 --quantize-draft int4 "
                                 "(a .gguf source keeps its own blocks), or run the fp16 pack on a GPU")
