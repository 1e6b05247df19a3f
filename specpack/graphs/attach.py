"""Attach a sampling head onto a plain forward graph: plain.onnx -> draft_step.onnx / verify.onnx.

One order for every edit (onnx-graphsurgeon's): import -> edit -> cleanup -> toposort -> export.
The plain graph is loaded without its weights (it may be far over 2 GB); its one external-data file is
moved, not copied, next to the new graph, so the pack holds each model's weights once. A quantized batched graph
(docs/batching.md) also reads the batch-1 graph's data file, already in the pack (`in_pack`: its name in the work
folder -> its name in the pack): those tensors are pointed there, only its own file moves.

The head reads the last `rows` positions only (draft: 1, verify: k + 1), so the lm_head computes only those:
its hidden-state input is sliced (prune_logits.py). A graph whose lm_head is not recognized still gets a
correct head, on sliced logits, and a LogitsNotPrunedWarning: every prefill then pays for S rows of logits.
"""

from __future__ import annotations

import errno
import os
import shutil
import warnings
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path

import onnx
from onnx import TensorProto

from specpack import names
from specpack.dtypes import BY_ONNX
from specpack.errors import SpecpackError
from specpack.graphs import sampling_graph, sampling_trt
from specpack.graphs.batched_head import (
    add_batched_greedy_head,
    add_batched_verify_head,
    batched_greedy_head_io,
    batched_verify_head_io,
)
from specpack.graphs.draft_tree_head import draft_tree_head, draft_tree_head_io
from specpack.graphs.heads import (
    AddHead,
    HeadIO,
    Transform,
    add_draft_head,
    add_verify_head,
    draft_head_io,
    verify_head_io,
)
from specpack.graphs.onnx_builder import GraphBuilder, Value
from specpack.graphs.prune_logits import LmHead, find_lm_head, slice_lm_head_input
from specpack.graphs.tree_head import add_tree_verify_head, tree_verify_head_io

TRANSFORMS: dict[str, Transform] = {"onnxruntime": sampling_graph.transform, "tensorrt": sampling_trt.transform}
MIN_OPSET = 18  # ReduceMax / ReduceMin take axes as an input from opset 18
# ONNX Runtime contrib ops registered in the default ONNX domain (onnxruntime-genai's model builder writes them
# there), unknown to onnx's checker; checked as the contrib ops they are (see _check_model)
ORT_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"})
ORT_DOMAIN = "com.microsoft"


class LogitsNotPrunedWarning(UserWarning):
    """The lm_head was not recognized: the graph computes logits at every position and slices them after."""


def build_verify_graph(plain_onnx: Path, out_onnx: Path, vocab_size: int, heads: str = "onnxruntime") -> None:
    """verify.onnx: the target forward + sampling transform + acceptance test (names.py, "Verify graph").
    heads: "onnxruntime" (oracle-exact) or "tensorrt" (TensorRT's ops, sampling_trt.py)."""
    add_head = partial(add_verify_head, transform=TRANSFORMS[heads])
    _attach(Path(plain_onnx), Path(out_onnx), vocab_size, add_head, verify_head_io(vocab_size))


def build_batched_verify_graph(plain_onnx: Path, out_onnx: Path, vocab_size: int, heads: str = "onnxruntime", *,
                               in_pack: Mapping[str, str] | None = None) -> None:
    """The batched verify graph (docs/batching.md): the batched static form (export/batched_export.py) + the batched
    verify head (batched_head.py), its lm_head computing K + 1 rows per batch row. `in_pack`: data files it shares
    with the batch-1 graph (module docstring)."""
    add_head = partial(add_batched_verify_head, transform=TRANSFORMS[heads])
    _attach(Path(plain_onnx), Path(out_onnx), vocab_size, add_head, batched_verify_head_io(vocab_size),
            in_pack=in_pack or {})


def build_batched_greedy_graph(plain_onnx: Path, out_onnx: Path, vocab_size: int, *,
                               in_pack: Mapping[str, str] | None = None) -> None:
    """The batched static form + the batched greedy head (`best` [B, K+1]: each row's last k_b + 1 positions, its
    lm_head computing K + 1 rows per batch row): the batched greedy draft's graph."""
    _attach(Path(plain_onnx), Path(out_onnx), vocab_size, add_batched_greedy_head, batched_greedy_head_io(),
            in_pack=in_pack or {})


def build_tree_verify_graph(plain_onnx: Path, out_onnx: Path, vocab_size: int, max_nodes: int) -> None:
    """verify.onnx of a tree pack: the target's tree form (torch_export.py: it takes `parents`) + the tree verify head
    (tree_head.py) in place of the chain head, reading the same `parents` (docs/trees.md)."""
    add_head = partial(add_tree_verify_head, max_nodes=max_nodes)
    _attach(Path(plain_onnx), Path(out_onnx), vocab_size, add_head, tree_verify_head_io(), shared={names.PARENTS})


def build_draft_step_graph(plain_onnx: Path, out_onnx: Path, vocab_size: int, heads: str = "onnxruntime") -> None:
    """draft_step.onnx: the draft forward + sampling transform + draw (names.py, "Draft step graph")."""
    add_head = partial(add_draft_head, transform=TRANSFORMS[heads])
    _attach(Path(plain_onnx), Path(out_onnx), vocab_size, add_head, draft_head_io(vocab_size))


def build_draft_tree_step_graph(plain_onnx: Path, out_onnx: Path, vocab_size: int, width: int) -> None:
    """draft_step.onnx of a tree pack's draft model: the draft's tree form (torch_export.py: it takes draft_positions
    and draft_mask) + the draft head and each own row's top-`width` (draft_tree_head.py), sharing draft_positions."""
    _attach(Path(plain_onnx), Path(out_onnx), vocab_size, draft_tree_head(width), draft_tree_head_io(vocab_size, width),
            shared={names.DRAFT_POSITIONS})


def _attach(plain: Path, out: Path, vocab_size: int, add_head: AddHead, io: HeadIO,
            shared: frozenset[str] | set[str] = frozenset(), in_pack: Mapping[str, str] | None = None) -> None:
    """`shared`: head inputs the plain graph must already have (the tree's parents), read by both. `in_pack`:
    external-data files already in the pack (module docstring)."""
    # import
    model = onnx.load(str(plain), load_external_data=False)
    graph = model.graph
    opset, logits_type, model_vocab = _check_plain(model, plain, io, vocab_size, shared)
    # edit: hidden [1, S, H] -> last rows [1, rows, H] -> lm_head -> logits [1, rows, V_model]
    #       -> [1, rows, vocab_size] -> head
    b = GraphBuilder(opset)
    logits: Value = names.LOGITS
    lm_head = find_lm_head(graph)
    before_lm_head: list[onnx.NodeProto] = []
    if isinstance(lm_head, LmHead):
        sliced = io.positions(b, lm_head.hidden)
        before_lm_head, b.nodes = b.nodes, []  # they go right before the lm_head MatMul
    else:
        warnings.warn(f"{plain}: lm_head not recognized, so logits are computed at every position and sliced "
                      f"after (correct, but prefill pays S * H * V * 2 flops): {lm_head}",
                      LogitsNotPrunedWarning, stacklevel=3)
        logits = io.positions(b, logits)
    if model_vocab != vocab_size:  # padded embedding rows (or a symbolic V): keep the tokenizer's ids
        logits = b.slice(logits, 0, vocab_size, axis=2)
    add_head(b, logits, logits_type, vocab_size)
    clash = {o for node in [*before_lm_head, *b.nodes] for o in node.output} & _value_names(graph)
    if clash:
        raise SpecpackError(f"{plain}: the graph already has values named like the head's",
                            found=", ".join(sorted(clash)[:5]), hint="rename them in export/")
    if isinstance(lm_head, LmHead):
        slice_lm_head_input(graph, lm_head, before_lm_head, sliced)
    graph.node.extend(b.nodes)  # cleanup / toposort: the head only reads values made earlier, so appending
    graph.input.extend(i for i in io.inputs if i.name not in shared)  # keeps the order; `logits` stays internal
    kept = [o for o in graph.output if o.name != names.LOGITS]
    del graph.output[:]
    graph.output.extend([*io.outputs, *kept])
    # export
    data_file = _relocate_external_data(model, plain, out, in_pack or {})
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(out))
    if data_file is not None:
        _move(*data_file)
    _check_model(out)


def _check_model(path: Path) -> None:
    """onnx's checker on the written graph. ONNX Runtime's contrib ops in the default domain
    (ORT_DEFAULT_DOMAIN_OPS) are unknown to it: the check then runs on a copy where those nodes are in ONNX
    Runtime's own domain, whose ops the checker leaves alone, so every other complaint still surfaces."""
    model = onnx.load(str(path), load_external_data=False)
    contrib = [n for n in model.graph.node if n.domain in ("", "ai.onnx") and n.op_type in ORT_DEFAULT_DOMAIN_OPS]
    if not contrib:
        onnx.checker.check_model(str(path))  # by path: a graph over 2 GB has its weights outside the proto
        return
    for node in contrib:
        node.domain = ORT_DOMAIN
    if not any(o.domain == ORT_DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(ORT_DOMAIN, 1))
    copy = path.with_name(f".{path.name}.check.onnx")  # beside the graph, so its external data resolves
    try:
        onnx.save_model(model, str(copy))
        onnx.checker.check_model(str(copy))
    finally:
        copy.unlink(missing_ok=True)


def _check_plain(model: onnx.ModelProto, plain: Path, io: HeadIO, vocab_size: int,
                 shared: frozenset[str] | set[str] = frozenset()) -> tuple[int, int, int | None]:
    """The plain graph's default-domain opset, its logits' dtype and vocabulary size (None if symbolic)."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise SpecpackError(f"{plain}: opset too old for the sampling heads", expected=f">= {MIN_OPSET}",
                            found=str(opset), hint="export with torch.onnx.export(dynamo=True), opset 18+")
    inputs = [i.name for i in model.graph.input]
    outputs = {o.name: o for o in model.graph.output}
    if names.LOGITS not in outputs or names.INPUT_IDS not in inputs:
        raise SpecpackError(f"{plain}: not a plain forward graph", expected=f"input {names.INPUT_IDS!r}, "
                            f"output {names.LOGITS!r}", found=f"inputs {inputs}, outputs {list(outputs)}")
    taken = [i.name for i in io.inputs if i.name in inputs and i.name not in shared]
    taken += [o.name for o in io.outputs if o.name in outputs]
    if taken:
        raise SpecpackError(f"{plain}: already has the head's inputs or outputs", found=", ".join(taken))
    lacking = sorted(set(shared) - set(inputs))
    if lacking:
        raise SpecpackError(f"{plain}: lacks inputs its head shares with it", expected=", ".join(sorted(shared)),
                            found=f"inputs {inputs[:8]}", hint="export the target with --max-tree-nodes")
    tensor_type = outputs[names.LOGITS].type.tensor_type
    if tensor_type.elem_type not in BY_ONNX:
        raise SpecpackError(f"{plain}: unsupported logits dtype", expected=" / ".join(d.element for d in BY_ONNX.values()),
                            found=TensorProto.DataType.Name(tensor_type.elem_type))
    dims = tensor_type.shape.dim
    model_vocab = dims[2].dim_value if len(dims) == 3 and dims[2].HasField("dim_value") else None
    if model_vocab is not None and model_vocab < vocab_size:
        raise SpecpackError(f"{plain}: logits narrower than the vocabulary", expected=f">= {vocab_size}",
                            found=str(model_vocab))
    return opset, tensor_type.elem_type, model_vocab


def _value_names(graph: onnx.GraphProto) -> set[str]:
    """Every value name of a graph (inputs, initializers, node outputs), subgraphs included."""
    found = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    for node in graph.node:
        found.update(node.output)
        for attr in node.attribute:
            for sub in [attr.g, *attr.graphs] if attr.HasField("g") else attr.graphs:
                found |= _value_names(sub)
    return found


def _tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """Initializers and attribute tensors (Constant values), subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sub in [attr.g, *attr.graphs] if attr.HasField("g") else attr.graphs:
                yield from _tensors(sub)


def _relocate_external_data(model: onnx.ModelProto, plain: Path, out: Path,
                            in_pack: Mapping[str, str]) -> tuple[Path, Path] | None:
    """Point every external tensor at `<out.name>.data` next to `out`, or, where it names a file of `in_pack`, at
    that file's name in the pack (it must be there already); returns (from, to) for the move of its own file."""
    external = [t for t in _tensors(model.graph) if t.data_location == TensorProto.EXTERNAL]
    for tensor in external:
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value in in_pack:
                entry.value = in_pack[entry.value]
                if not (out.parent / entry.value).is_file():
                    raise SpecpackError(f"{plain}: a shared external-data file is not in the pack",
                                        expected=str(out.parent / entry.value), found="no such file",
                                        hint="attach the graph it belongs to first")
    external = [t for t in external if not any(e.key == "location" and e.value in set(in_pack.values())
                                               for e in t.external_data)]
    locations = {e.value for t in external for e in t.external_data if e.key == "location"}
    if not locations:
        return None
    if len(locations) > 1:
        raise SpecpackError(f"{plain}: weights are spread over several external-data files",
                            expected="one file", found=", ".join(sorted(locations)))
    src = plain.parent / locations.pop()
    if not src.is_file():
        raise SpecpackError(f"{plain}: external-data file missing", expected=str(src), found="no such file")
    dst_name = f"{out.name}.data"
    for tensor in external:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = dst_name
    return src, out.parent / dst_name


def _move(src: Path, dst: Path) -> None:
    """Rename (no copy); across file systems fall back to shutil.move."""
    if src.resolve() == dst.resolve():
        return
    try:
        os.replace(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.move(str(src), str(dst))
