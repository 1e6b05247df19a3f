"""The quantize stage: a plain graph in, its weight-only quantized copy out, plus what each weight became.

    plain.onnx ─ find_sites ─> weights W [K, N] ─ source ─> BlockQuant, or kept ─ rewrite ─> plain.<mode>.onnx
                                                                                           + one .data file
Sources:
    int4 / int8   ONNX Runtime's own quantizer (matmul_nbits_quantizer's kernels) on W: k-quant search for
                  int4 (kquant.py's copy), round to nearest for int8 (modes.py)
    int4 of a     the GGUF's Q4_K tensors fit from their own 4-bit integers (q4k_fit.py: no search, a lower
    GGUF source   error than the search's), found by their values; the other weights searched as above
    gguf          the GGUF file's blocks where they map exactly (gguf_blocks.py), found by their values;
                  other quantized formats are dequantized (W is that) + quantized by ONNX Runtime's
                  quantizer; float GGUF tensors stay float

It works on any plain graph (concat or static KV cache, fp32 or fp16): it touches only MatMuls with a
constant 2-D weight and Gathers of a constant table by input_ids (sites.py), one weight in memory at a time.

Two graphs of one model (spec-export --max-batch: the batch-1 graph and its batched form, docs/batching.md) go
through quantize_graph_pair: the first is quantized as above; each weight of the second whose values equal one of
the first's takes the first's blocks (no second search or fit), and every tensor of the second whose bytes equal
one the first wrote points into the first's data file (external_data.SharedData): the same quantized weights,
bit for bit, stored once.

    plain.onnx ─── quantize ──> plain.<mode>.onnx + plain.<mode>.onnx.data <───────────┐ equal tensors point here
    batched.onnx ─ quantize (choices by weight hash) ─> batched.<mode>.onnx + its own .data (what is not equal)
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from specpack import names
from specpack.errors import SpecpackError
from specpack.graphs.prune_logits import LmHead, find_lm_head
from specpack.quantize import modes
from specpack.quantize.external_data import DataFileWriter, SharedData, stored_bytes
from specpack.quantize.nbits import BlockQuant, from_values, quantize_kquant, quantize_rtn
from specpack.quantize.rewrite import MS_DOMAIN, GraphEdit, float_type_of
from specpack.quantize.sites import Site, WeightReader, find_sites

MIN_BLOCK = 16  # MatMulNBits' smallest block
Q4K_BLOCK = 32  # Q4_K's blocks of a scale and a min: int4's block size, where q4k_fit.py applies


@dataclass
class Choice:
    """What one weight became: a BlockQuant, or kept as it was, and the record of why."""

    quant: BlockQuant | None
    record: dict[str, Any]


WeightKey = tuple[str, bool, int, tuple[int, ...], str]  # site kind, lm_head, data type, dims, sha256 of the bytes


@dataclass
class SharedWeights:
    """What a model's first quantized graph hands its second (quantize_graph_pair): each weight's Choice by the hash
    of its stored values, and the first graph's data file indexed by content."""

    choices: dict[WeightKey, Choice] = field(default_factory=dict)
    data: SharedData = field(default_factory=SharedData)
    first_done: bool = False


def quantize_graph_pair(plain: Path, out: Path, batched_plain: Path, batched_out: Path, method: str,
                        gguf_path: Path | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """`plain` quantized to `out`, then `batched_plain` (the same model's batched form) to `batched_out` with the same
    quantized weights, tensors equal to `out`'s pointing into out's data file; returns both manifest records (the
    second's `shared` says what it took from the first)."""
    shared = SharedWeights()
    record = quantize_plain_graph(plain, out, method, gguf_path, shared=shared)
    shared.first_done = True
    return record, quantize_plain_graph(batched_plain, batched_out, method, gguf_path, shared=shared)


def quantize_plain_graph(plain: Path, out: Path, method: str, gguf_path: Path | None = None,
                         spec: modes.WeightOnlySpec | None = None, shared: SharedWeights | None = None) -> dict[str, Any]:
    """Write the `method` ("int4" | "int8" | "gguf") form of `plain` to `out`; returns its manifest record.
    `gguf_path`: the GGUF file `plain` was exported from (gguf: needed; int4: its Q4_K blocks are fit, not
    searched). `spec` overrides the mode's settings (modes.SPECS). `shared`: see quantize_graph_pair."""
    plain, out = Path(plain), Path(out)
    spec = spec or modes.SPECS[method]
    if method == modes.GGUF and gguf_path is None:
        raise SpecpackError("--quantize gguf needs a GGUF source", expected="a .gguf model file",
                            found="a model directory or hub id", hint="use int4 or int8 for other sources")
    start = time.perf_counter()
    model = onnx.load(str(plain), load_external_data=False)
    graph = model.graph
    reader = WeightReader(plain)
    inits = {t.name: t for t in graph.initializer}
    sites = [s for s in find_sites(graph) if s.kind != "embedding" or graph.node[s.node].input[1] == names.INPUT_IDS]
    source = _source(method, spec, gguf_path)
    tied = {s.tensor for s in sites if s.kind == "tied"}
    lm_head = find_lm_head(graph)
    lm_head_node = lm_head.index if isinstance(lm_head, LmHead) else None
    writer = DataFileWriter(out, None if shared is None else shared.data)
    edit = GraphEdit(graph, writer, float_type_of(graph))
    reused = quantized = 0
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    removed: set[str] = set()
    packed_tables: dict[str, tuple[str, BlockQuant]] = {}
    records = []
    try:
        for site in _track(_embeddings_first(sites), f"quantizing {plain.stem} ({method}, {spec.algorithm})"):
            if site.kind == "tied" and site.tensor not in packed_tables:
                records.append({**_describe(site), "path": "kept", "why": "its embedding was not quantized"})
                continue
            if site.kind == "tied":
                packed, bq = packed_tables[site.tensor]
                replaced[site.node] = edit.matmul(site, bq, spec.accuracy_level, packed_name=packed)
                dropped.add(site.transpose)  # type: ignore[arg-type]
                records.append({**_describe(site), "path": "shared", "with": site.tensor, "bits": bq.bits,
                                "block_size": bq.block_size})
                continue
            weight = site.weight_of(reader.read(inits[site.tensor]))  # [K, N]
            is_lm_head = site.node == lm_head_node or site.tensor in tied
            key = None if shared is None else _weight_key(site, is_lm_head, inits[site.tensor], reader)
            choice = None if shared is None or key is None else shared.choices.get(key)
            if choice is not None:
                reused += choice.quant is not None
            else:
                choice = source.choose(site, weight, is_lm_head=is_lm_head)
                if shared is not None and key is not None and not shared.first_done:
                    shared.choices[key] = choice
            records.append({**_describe(site), **choice.record})
            if choice.quant is None:
                continue
            quantized += 1
            if site.kind == "embedding":
                replaced[site.node], packed = edit.embedding(site, choice.quant, shared=site.tensor in tied)
                packed_tables[site.tensor] = (packed, choice.quant)
            else:
                replaced[site.node] = edit.matmul(site, choice.quant, spec.accuracy_level)
            removed.add(site.tensor)
            del weight, choice
        _write(model, out, writer, reader, edit, replaced, dropped, removed)
    except BaseException:
        writer.close()
        raise
    before = sum(stored_bytes(t) for t in inits.values())
    after = sum(stored_bytes(t) for t in model.graph.initializer)
    record = {**spec.to_dict(), "method": method, "tensors": records, "summary": summarize(records),
              "bytes_before": before, "bytes_after": after, "seconds": round(time.perf_counter() - start, 1)}
    if not isinstance(source, _RtnSource):
        record["gguf"] = str(gguf_path)
    if shared is not None and shared.first_done:  # what this graph took from its model's first graph
        record["shared"] = {"weights_reused": reused, "weights_quantized": quantized,
                            "tensors_shared": shared.data.reused, "bytes_shared": shared.data.reused_bytes}
    _log(f"quantized {plain.name} ({method}): {before / 2**20:.0f} -> {after / 2**20:.0f} MiB, "
         + ", ".join(f"{n} {path}" for path, n in summarize(records).items()))
    return record


def _weight_key(site: Site, is_lm_head: bool, tensor: onnx.TensorProto, reader: WeightReader) -> WeightKey | None:
    """A weight's identity across graphs: its site's kind, whether it is an lm_head, and its stored bytes (None for
    a tensor not stored as raw bytes: it is quantized again)."""
    data = reader.raw_bytes(tensor)
    if not len(data):
        return None
    digest = hashlib.sha256(data).hexdigest()
    return site.kind, is_lm_head, tensor.data_type, tuple(tensor.dims), digest


def summarize(records: list[dict[str, Any]]) -> dict[str, int]:
    """How many weights took each path, e.g. {"gguf-exact Q4_K": 169, "gguf-requantized Q5_K -> int8": 2}."""
    counts: Counter[str] = Counter()
    for r in records:
        label = r["path"] + (f" {r['format']}" if "format" in r else "")
        if r["path"] in ("rtn", "k_quant", "gguf-requantized", "q4k-fit"):
            label += f" -> int{r['bits']}"
        counts[label] += 1
    return dict(sorted(counts.items()))


def _source(method: str, spec: modes.WeightOnlySpec, gguf_path: Path | None) -> _RtnSource | _GgufSource | _Q4kFitSource:
    """Where each weight's blocks come from: the GGUF file's own (gguf), fit from its Q4_K blocks (the default
    int4 of a GGUF source), else the mode's quantizer."""
    if gguf_path is not None and method == modes.GGUF:
        return _GgufSource(Path(gguf_path), spec)
    if gguf_path is not None and (spec.bits, spec.block_size, spec.algorithm, spec.symmetric) == (4, Q4K_BLOCK, "k_quant", False):
        return _Q4kFitSource(Path(gguf_path), spec)
    return _RtnSource(spec)


def _embeddings_first(sites: list[Site]) -> list[Site]:
    """Embeddings before the lm_heads that share their table."""
    return sorted(sites, key=lambda s: (s.kind == "tied", s.node))


def _track(sites: list[Site], description: str) -> Iterable[Site]:
    """The sites, with a progress bar on stderr (k-quant takes minutes on a 1.5B model)."""
    from rich.console import Console
    from rich.progress import track

    return track(sites, description=description, console=Console(stderr=True), transient=True)


def _describe(site: Site) -> dict[str, Any]:
    return {"tensor": site.tensor, "kind": site.kind, "k": site.k, "n": site.n}


class _RtnSource:
    """Round to nearest with ONNX Runtime's quantizer, at the mode's bits and block size (16 if K needs it)."""

    def __init__(self, spec: modes.WeightOnlySpec) -> None:
        self.spec = spec

    def choose(self, site: Site, weight: np.ndarray, is_lm_head: bool = False, bits: int | None = None,
               extra: dict[str, Any] | None = None) -> Choice:
        spec = self.spec
        bits = bits or (spec.lm_head_bits if is_lm_head and spec.lm_head_bits else spec.bits)
        block = next((b for b in (spec.block_size, MIN_BLOCK) if site.k % b == 0), None)
        if block is None:
            return Choice(None, {"path": "kept", "why": f"K = {site.k} is not a multiple of {MIN_BLOCK}", **(extra or {})})
        if spec.algorithm == "k_quant" and not spec.symmetric:
            quant = quantize_kquant(weight, bits, block)
        else:
            quant = quantize_rtn(weight, bits, block, spec.symmetric)
        return Choice(quant, {"path": "rtn" if spec.algorithm == "rtn" else spec.algorithm, "bits": bits,
                              "block_size": block, "bytes": quant.nbytes, **(extra or {})})


class _GgufSource:
    """The GGUF file's tensors, matched to the graph's weights by their values (gguf_match.py)."""

    def __init__(self, path: Path, spec: modes.WeightOnlySpec) -> None:
        from specpack.quantize.gguf_match import GgufTensors

        self.tensors = GgufTensors(path)
        self.rtn = _RtnSource(spec)

    def choose(self, site: Site, weight: np.ndarray, is_lm_head: bool = False) -> Choice:
        from specpack.quantize.gguf_blocks import exact_block_quant

        tensor = self.tensors.match(site, weight)
        if tensor is None:
            return Choice(None, {"path": "kept", "why": "no GGUF tensor has these values"})
        fmt = tensor.tensor_type.name
        found = {"gguf_tensor": tensor.name, "format": fmt}
        if fmt in ("F32", "F16", "BF16"):
            return Choice(None, {"path": "gguf-float", **found})
        quant = exact_block_quant(tensor.data, fmt, (site.n, site.k), reference=weight)
        if isinstance(quant, BlockQuant):
            return Choice(quant, {"path": "gguf-exact", "bits": quant.bits, "block_size": quant.block_size,
                                  "bytes": quant.nbytes, **found})
        bits = modes.fallback_bits(8 * tensor.n_bytes / max(tensor.n_elements, 1))
        return self.rtn.choose(site, weight, is_lm_head, bits, {**found, "path": "gguf-requantized", "why": quant})


class _Q4kFitSource:
    """int4 from a GGUF source: its Q4_K tensors' blocks fit from their own integers (q4k_fit.py), every other
    weight searched (k-quant) as without the file. The int4 layout either way: blocks of 32, uint8 zero points."""

    def __init__(self, path: Path, spec: modes.WeightOnlySpec) -> None:
        from specpack.quantize.gguf_match import GgufTensors

        self.tensors = GgufTensors(path)
        self.search = _RtnSource(spec)

    def choose(self, site: Site, weight: np.ndarray, is_lm_head: bool = False) -> Choice:
        from specpack.quantize.q4k_fit import q4k_int4_blocks

        tensor = self.tensors.match(site, weight)
        if tensor is None:
            return self.search.choose(site, weight, is_lm_head)
        found = {"gguf_tensor": tensor.name, "format": tensor.tensor_type.name}
        fitted = None
        if found["format"] == "Q4_K" and not (is_lm_head and self.search.spec.lm_head_bits):
            fitted = q4k_int4_blocks(self.tensors.raw(tensor), weight.T)
        if fitted is None:
            return self.search.choose(site, weight, is_lm_head, extra=found)
        q, scale, zero, searched = fitted
        quant = from_values(q.reshape(site.n, site.k), scale.reshape(site.n, -1), 4, Q4K_BLOCK,
                            zero.reshape(site.n, -1))
        return Choice(quant, {"path": "q4k-fit", "bits": 4, "block_size": Q4K_BLOCK, "bytes": quant.nbytes,
                              "searched_blocks": searched, **found})


def _write(model: onnx.ModelProto, out: Path, writer: DataFileWriter, reader: WeightReader, edit: GraphEdit,
           replaced: dict[int, list[onnx.NodeProto]], dropped: set[int], removed: set[str]) -> None:
    """New node list and initializers; every kept external tensor copied into the new data file."""
    graph = model.graph
    nodes: list[onnx.NodeProto] = []
    for i, node in enumerate(graph.node):
        if i in replaced:
            nodes.extend(replaced[i])
        elif i not in dropped:
            nodes.append(node)
    still_read = {name for node in nodes for name in node.input}
    kept = []
    for t in graph.initializer:
        if t.name in removed and t.name not in still_read:
            continue
        kept.append(writer.copy(t, reader.raw_bytes(t)) if t.data_location == onnx.TensorProto.EXTERNAL else t)
    writer.close()
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend([*kept, *edit.initializers])
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))
    onnx.save_model(model, str(out))


def _log(message: str) -> None:
    print(f"[spec-export] {message}", file=sys.stderr, flush=True)
