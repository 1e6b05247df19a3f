"""The cuda backend's draft head engine: head_step.onnx of the static form on the device (docs/heads.md).

    DeviceHead   the DraftEngine of a static head: per slot its one-layer DeviceStaticKVCache, the hidden state
                 ping-pong [2, 1, 1, H], q [1, k_max, V], token [1]; it reads the target's features cache

The head reads the target's whole features cache [1, 1, M, F] (what the static verify writes in place, DeviceTarget)
and takes rows [L, L + C) in the graph, so a run binds the same buffers whatever the head's length L: the greedy form
is captured once per (C, W, which half of the ping-pong is the input) for C <= k_max + 1 and replayed. A longer catch-up
(the prompt's rows at the first proposal, or the rows committed during k = 0 steps) runs, where the backend chunks
greedy runs (`chunked_runs`), as captured chunks of LONG_CHUNK rows while more are left, then of k_max + 1 and the
rest, as the target's prefill does: no graph per prompt length and no uncaptured run (the first catch-up of a prompt
of 256 rows took 59 ms uncaptured on an H100, 22x a target step: bench/README.md, "Run F"); otherwise uncaptured
from a [1, max_len] staging buffer. Per step the host
uploads the C + W new ids (a few bytes) and reads back the drawn token, never q or logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from specpack import names
from specpack.contract.manifest import HeadEntry
from specpack.limits import numpy_dtype
from specpack.runtime.backends.cuda import LONG_CHUNK, SlotBase, SlotSessions
from specpack.runtime.device_buffers import DeviceArray, DeviceStaticKVCache, DeviceView, bind
from specpack.runtime.engine import HeadTreeRun, TopRows, head_rows, tree_refusal
from specpack.runtime.head_tree_rows import HeadTreeBuffers
from specpack.runtime.state import DecodeState

if TYPE_CHECKING:
    from specpack.runtime.backends.cuda import CudaBackend


@dataclass(kw_only=True)
class _HeadSlot(SlotBase):
    """One request slot of the head: SlotBase ((C, W, current) -> bound IOBinding) and every buffer a run binds."""

    hidden: DeviceArray                                         # [2, 1, 1, H] hidden_in | hidden_out, ping-pong
    q: DeviceArray                                              # [1, k_max, V] fp32, what the verify reads
    token: DeviceArray                                          # [1] int64
    uniform: DeviceArray                                        # [1] fp32
    draft_id: DeviceArray                                       # [1, 1] int64: x_{t+1} of a drafted row
    long_ids: DeviceArray                                       # [1, max_len] int64: a catch-up past k_max + 1 rows
    ids: dict[int, DeviceArray] = field(default_factory=dict)   # C -> input_ids [1, C] (C <= k_max + 1)
    current: int = 0                                            # the half of `hidden` that holds hidden_in
    tree: _TreeSlot | None = None                               # a tree-form head's buffers


@dataclass(kw_only=True)
class _TreeSlot:
    """A tree-form head's device buffers of one slot (the host side: head_tree_rows.HeadTreeBuffers)."""

    position: DeviceArray       # [1, 1] int64: a chain's own row's position (its cache row)
    all_rows: DeviceArray       # [1, 1, M] bool, all true: a chain's own row's mask
    ids: DeviceArray            # [1, K] int64: a tree run's own rows' tokens
    hidden_in: DeviceArray      # [1, K, H]
    positions: DeviceArray      # [1, K] int64
    mask: DeviceArray           # [1, K, M] bool
    tokens: DeviceArray         # [1, K + 1, K] int64: a run's top-K (read back after a tree run)
    logprobs: DeviceArray       # [1, K + 1, K] fp32
    hidden: DeviceArray         # [1, K + 1, H]


class DeviceHead(SlotSessions[_HeadSlot]):
    """head_step.onnx (static form): C catch-up rows from the target's features cache and W drafted rows in, one
    drawn token (read back), its q row and hidden_out (left on the device) out."""

    entry: HeadEntry

    def __init__(self, backend: CudaBackend, head: HeadEntry, features: list[DeviceArray]) -> None:
        """features: the target engine's features cache per slot [1, 1, max_len, F]."""
        super().__init__(backend, head)
        m = backend.manifest
        self.features = features
        self.short_max = m.k_max + 1  # catch-ups over at most this many rows are captured (one graph per C)
        self.vocab, self.hidden = m.vocab_size, head.hidden
        dtype = numpy_dtype(head.dtype)
        self.slots = [self._slot(m.max_len, m.k_max, dtype) for _ in range(backend.options.slots)]
        self._long_host = np.zeros((1, m.max_len), np.int64)  # [1, max_len]: staged whole (update_inplace)
        tree = m.target.graph.tree
        self.tree_width = head.tree_width if tree is not None else 0  # K; 0: chains only
        self.tree: HeadTreeBuffers | None = None  # the host side of tree runs
        if self.tree_width:
            self.tree = HeadTreeBuffers(len(self.slots), self.tree_width, tree.max_nodes + 1 if tree else 1,
                                        m.max_len, head.hidden, dtype)
            for slot in self.slots:
                slot.tree = self._tree_slot(m.max_len, dtype)
            self._tree_ids = np.zeros((1, self.tree_width), np.int64)  # [1, K] staged whole

    def _slot(self, max_len: int, k_max: int, dtype: np.dtype) -> _HeadSlot:
        h, device = self.entry, self.device
        cache = DeviceStaticKVCache(1, h.kv_heads, h.head_dim, max_len, dtype, device)
        return _HeadSlot(cache, SlotBase.sampling_buffers(device), hidden=DeviceArray((2, 1, 1, h.hidden), dtype, device),
                         q=DeviceArray((1, k_max, self.vocab), np.float32, device),
                         token=DeviceArray((1,), np.int64, device), uniform=DeviceArray((1,), np.float32, device),
                         draft_id=DeviceArray((1, 1), np.int64, device),
                         long_ids=DeviceArray((1, max_len), np.int64, device))

    def _tree_slot(self, max_len: int, dtype: np.dtype) -> _TreeSlot:
        k, h, device = self.tree_width, self.hidden, self.device
        all_rows = DeviceArray((1, 1, max_len), np.bool_, device)
        all_rows.write(np.ones((1, 1, max_len), np.bool_))
        return _TreeSlot(position=DeviceArray((1, 1), np.int64, device), all_rows=all_rows,
                         ids=DeviceArray((1, k), np.int64, device), hidden_in=DeviceArray((1, k, h), dtype, device),
                         positions=DeviceArray((1, k), np.int64, device),
                         mask=DeviceArray((1, k, max_len), np.bool_, device),
                         tokens=DeviceArray((1, k + 1, k), np.int64, device),
                         logprobs=DeviceArray((1, k + 1, k), np.float32, device),
                         hidden=DeviceArray((1, k + 1, h), dtype, device))

    def step(self, state: DecodeState, end: int, row: int) -> int:
        slot = self.slots[state.slot]
        c, w = head_rows(slot.cache.length, end, state.length)
        if self._chunked(slot):  # a long greedy catch-up as captured chunks (cuda.py's LONG_CHUNK, then k_max + 1)
            while c > self.short_max and c != LONG_CHUNK:
                piece = LONG_CHUNK if c > LONG_CHUNK else self.short_max
                self._run(state, slot, piece, 0, row)  # its token, q and hidden_out are overwritten by the next
                c -= piece
        return self._run(state, slot, c, w, row)

    def _chunked(self, slot: _HeadSlot) -> bool:
        return self.backend.chunked_runs and slot.greedy

    def _run(self, state: DecodeState, slot: _HeadSlot, c: int, w: int, row: int) -> int:
        """One run over the next C catch-up rows and W drafted rows (head_rows), its drawn token read back."""
        cache, current = slot.cache, slot.current
        start = cache.length
        kv_inputs = cache.bind_inputs(c + w)  # uploads the mask when the length changed
        ids = self._upload_ids(slot, state.ids[None, start + 1 : start + 1 + c])  # [1, C]
        if w:
            slot.draft_id.write(state.ids[None, start + 1 : start + 2])  # [1, 1] x_{t+1} of the drafted row t = start
            if slot.tree is not None:  # the tree form: a chain's own row sits at its cache row
                slot.tree.position.write(np.array([[start + c]], np.int64))
        if not slot.greedy:
            slot.uniform.write(state.uniforms.draft[row : row + 1])
        session = self.session(slot.greedy)
        # fixed shapes and addresses: bound once, captured, replayed
        captured = slot.greedy and (c <= self.short_max or (self._chunked(slot) and c == LONG_CHUNK))
        key = (c, w, current)
        binding = slot.bindings.get(key) if captured else None
        if binding is None:
            binding = session.session.io_binding()
            bind(binding, self.device, *self._views(state.slot, slot, ids, kv_inputs, c + w, w, row),
                 session.input_names)
            if captured:
                slot.bindings[key] = binding
        session.run(binding, (state.slot, *key) if captured else None)
        cache.advance(c + w)
        slot.current = 1 - current  # this run's hidden_out is the next drafted row's hidden_in
        return int(slot.token.read()[0])

    def _views(self, index: int, slot: _HeadSlot, ids: DeviceView, kv_inputs: dict[str, DeviceView], rows: int, w: int,
               row: int) -> tuple[dict[str, DeviceView], dict[str, DeviceView]]:
        """What a run over `rows` = C catch-up + W drafted rows binds: inputs, outputs. Greedy runs write q into one
        fixed row (a captured graph keeps its addresses; the greedy verify never reads q); sampling runs into `row`."""
        h, half = self.hidden, slot.current * self.hidden
        inputs = {names.INPUT_IDS: ids, names.FEATURES: self.features[index].view(),
                  names.DRAFT_IDS: slot.draft_id.view((1, w)), names.HIDDEN_IN: slot.hidden.view((1, w, h), half),
                  names.UNIFORM: slot.uniform.view(), **kv_inputs,
                  **{k: v.view() for k, v in slot.sampling.items()}}
        outputs = {names.TOKEN: slot.token.view(), names.HIDDEN_OUT: slot.hidden.view((1, 1, h), h - half),
                   names.PROBS: slot.q.view((1, self.vocab), 0 if slot.greedy else row * self.vocab),  # [1, V]
                   **slot.cache.bind_outputs(rows)}
        tree = slot.tree
        if tree is not None:  # the tree form, run as a chain: positions and mask of the own row, every output bound
            inputs |= {names.DRAFT_POSITIONS: tree.position.view((1, w)),
                       names.DRAFT_MASK: tree.all_rows.view((1, w, tree.all_rows.shape[2]))}
            outputs |= self._tree_outputs(tree, w)
        return inputs, outputs

    def _tree_outputs(self, tree: _TreeSlot, w: int) -> dict[str, DeviceView]:
        k, h = self.tree_width, self.hidden
        return {names.TREE_TOKENS: tree.tokens.view((1, w + 1, k)), names.TREE_LOGPROBS: tree.logprobs.view((1, w + 1, k)),
                names.TREE_HIDDEN: tree.hidden.view((1, w + 1, h))}

    def tree_step(self, state: DecodeState, run: HeadTreeRun | None) -> TopRows:
        """A token tree's run (engine.TreeDraftEngine): the catch-up (run None) or `run`'s own rows. The inputs are
        built on the host (head_tree_rows.HeadTreeBuffers) and uploaded into fixed buffers, so a greedy run of C <=
        k_max + 1 catch-up rows is captured once per (C, W) and replayed; a longer greedy catch-up (a prompt's first,
        or one after T = 0 steps) goes first as captured chunks, as `step`'s does (its outputs overwritten by the
        next); the top-K and the rows' outputs are read back (a later run's hidden_in is gathered on the host:
        docs/heads.md, "What remains")."""
        host, slot = self.tree, self.slots[state.slot]
        tree = slot.tree
        if host is None or tree is None:
            raise tree_refusal("this pack's draft head (exported without --max-tree-nodes)")
        i, cache = state.slot, slot.cache
        index = host.next_run(i, run)
        if run is None:  # the catch-up: rows from target features, no own row
            c, w = state.length - 1 - cache.length, 0
            if self._chunked(slot):
                while c > self.short_max and c != LONG_CHUNK:
                    piece = LONG_CHUNK if c > LONG_CHUNK else self.short_max
                    self._tree_run(state, slot, tree, piece, 0)
                    c -= piece
        else:
            c, w = 0, len(run.tokens)
            host.own_inputs(i, run, cache.length)  # fills the host buffers, uploaded whole (the first W rows are bound)
            self._tree_ids[0, :w] = run.tokens
            tree.ids.write(self._tree_ids)
            tree.hidden_in.write(host.hidden_in[i])
            tree.positions.write(host.positions[i])
            tree.mask.write(host.mask[i])
        start = cache.length  # the last run's first row
        self._tree_run(state, slot, tree, c, w)
        r = self.tree_width + 1
        host.tokens[i][index, : w + 1] = tree.tokens.read()[0, : w + 1]
        host.logprobs[i][index, : w + 1] = tree.logprobs.read()[0, : w + 1]
        host.hidden[i][index * r : index * r + w + 1] = tree.hidden.read()[0, : w + 1]
        return host.top_rows(i, index, w, start if w else start + c - 1)

    def _tree_run(self, state: DecodeState, slot: _HeadSlot, tree: _TreeSlot, c: int, w: int) -> None:
        """One tree-form run over the next C catch-up rows and the W own rows already uploaded; the cache advances."""
        i, cache = state.slot, slot.cache
        start = cache.length
        kv_inputs = cache.bind_inputs(c + w)  # uploads the mask when the length changed
        ids = self._upload_ids(slot, state.ids[None, start + 1 : start + 1 + c])  # [1, C]
        session = self.session(slot.greedy)  # the request's form (its drawn token is not read)
        # every buffer below is fixed: bound once per (C, W) and captured, a chunk of LONG_CHUNK rows too
        captured = slot.greedy and (c <= self.short_max or (self._chunked(slot) and c == LONG_CHUNK))
        key = ("tree", c, w)
        binding = slot.bindings.get(key) if captured else None
        if binding is None:
            binding = session.session.io_binding()
            bind(binding, self.device, *self._tree_views(i, slot, tree, ids, kv_inputs, c, w), session.input_names)
            if captured:
                slot.bindings[key] = binding
        session.run(binding, (i, *key) if captured else None)
        cache.advance(c + w)

    def _tree_views(self, index: int, slot: _HeadSlot, tree: _TreeSlot, ids: DeviceView,
                    kv_inputs: dict[str, DeviceView], c: int, w: int
                    ) -> tuple[dict[str, DeviceView], dict[str, DeviceView]]:
        """What a tree run over C catch-up + W own rows binds: inputs, outputs (fixed buffers, views by C and W)."""
        h, m = self.hidden, tree.mask.shape[2]
        inputs = {names.INPUT_IDS: ids, names.FEATURES: self.features[index].view(),
                  names.DRAFT_IDS: tree.ids.view((1, w)), names.HIDDEN_IN: tree.hidden_in.view((1, w, h)),
                  names.DRAFT_POSITIONS: tree.positions.view((1, w)), names.DRAFT_MASK: tree.mask.view((1, w, m)),
                  names.UNIFORM: slot.uniform.view(), **kv_inputs, **{n: v.view() for n, v in slot.sampling.items()}}
        outputs = {names.TOKEN: slot.token.view(), names.HIDDEN_OUT: slot.hidden.view((1, 1, h), h),
                   names.PROBS: slot.q.view((1, self.vocab)), **self._tree_outputs(tree, w),
                   **slot.cache.bind_outputs(c + w)}
        return inputs, outputs

    def _upload_ids(self, slot: _HeadSlot, host: np.ndarray) -> DeviceView:
        """input_ids [1, C] on the device: a staging buffer per C up to k_max + 1 (fixed addresses), else a prefix of
        the [1, max_len] one; C = 0 binds an empty view (of the draft id's buffer: a valid address)."""
        c = host.shape[1]
        if c == 0:
            return slot.draft_id.view((1, 0))
        if c <= self.short_max or c == LONG_CHUNK:  # the captured run shapes (LONG_CHUNK: a chunked catch-up's)
            if c not in slot.ids:
                slot.ids[c] = DeviceArray((1, c), np.int64, self.device)
            slot.ids[c].write(host)
            return slot.ids[c].view()
        self._long_host[:, :c] = host
        slot.long_ids.write(self._long_host)
        return slot.long_ids.view((1, c))

    def q(self, state: DecodeState, k: int) -> DeviceView:
        return self.slots[state.slot].q.view((1, k, self.vocab))  # [1, k, V] on the device
