"""spec-export: model sources in, a pack directory out. Stages run in order, each files -> files:

    resolve sources (a .gguf file converts: the draft's and the target's at once) -> read model info -> vocabulary check
      -> plain graphs (export/, torch, one process each)          work/{draft,target}.onnx
         or onnxruntime-genai's model builder (--graphs builder)  work/{draft,target}-builder/model.onnx
         (which quantizes as it builds: --quantize-* int4 / int8)
         (--max-batch B: each model's batched static form too,    work/{draft,target}-batched.onnx
          in --dtype fp32 or fp16)
      -> quantize (quantize/, per model's mode: weight-only,      work/{draft,target}.{int4,int8,gguf}.onnx
         or calibrated Q/DQ from --calib-prompts)                 work/{draft,target}.{int8-sq,fp8}.onnx
         (a batched form: the same quantized weights, its tensors  work/{draft,target}-batched.{mode}.onnx
         that equal the batch-1 graph's read from that one's data file: quantize/stage.py, quantize_graph_pair)
      -> tokenizer -> fidelity of the quantized graphs against the plain ones (quantize/fidelity.py)
      -> attach heads (graphs/): draft_step.onnx / verify.onnx -> manifest (export/writer.py, the schema in contract/)
         (--max-tree-nodes T: the target's tree form + the tree head, and kv_compact.onnx; a draft model's tree form
          on torch graphs: own rows' positions and mask, each row's top-K; docs/trees.md)
      -> (--max-batch B) each model's batched (quantized) form + its batched head: verify_batched.onnx (the batched
         verify head), draft_batched.onnx (the greedy head); a quantized one shares verify.onnx.data /
         draft_step.onnx.data (docs/batching.md)

Each stage is a function returning a frozen record (export/stages.py: Sources, PlainGraphs, QuantizedGraphs,
AttachedGraphs) that the next stage reads; none is changed after it is returned. The work of each runs in its own
process (config.isolate), through the small module-level functions at the end of this file.

An n-gram pack (--drafter ngram) has no draft model: the draft's stages are skipped. A head pack (--draft-head HEAD)
has none either: the head is checked against the target (its weights' hash) before anything is exported, the
target's plain graph also outputs the features the head reads, and head_step.onnx is exported from the head
(export/head_export.py).

Everything is written into a staging directory beside the output and renamed into place at the end,
so a failed or interrupted export leaves no half-written pack, and --overwrite replaces only a pack
(export/staging.py).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from specpack.errors import SpecpackError
from specpack.export.config import ExportConfig
from specpack.export.graph_form import GraphForm, head_attention
from specpack.export.model_info import ModelInfo, read_model_info, require_weights
from specpack.export.progress import phase
from specpack.export.sources import resolve_source
from specpack.export.stages import AttachedGraphs, Graph, Model, PlainGraphs, QuantizedGraphs, Role, Sources
from specpack.export.staging import (
    check_destination,
    publish,
    run_isolated,
    run_isolated_all,
    staging_dir,
    stop_on_signals,
)
from specpack.export.writer import write_pack_manifest
from specpack.names import DRAFT_STEP_FILE, HEAD_STEP_FILE, VERIFY_FILE
from specpack.quantize import modes

if TYPE_CHECKING:
    from specpack.export.tokenizer_export import TokenizerRecord

T = TypeVar("T")


@stop_on_signals()  # SIGTERM stops the workers and removes the staging directory, as SIGINT does
def export_pack(draft_src: str | None, target_src: str, out: Path, config: ExportConfig | None = None) -> Path:
    """Export a draft/target pair to a pack at `out`; returns `out`. With config.drafter "ngram", draft_src is
    None and the pack holds the target alone (its drafts come from prompt lookup at run time)."""
    config = config or ExportConfig()
    out = Path(out)
    sources = resolve_sources(draft_src, target_src, out, config)
    with staging_dir(out) as staging:
        work = staging / "work"
        work.mkdir()
        plain = plain_graphs(sources, work, config)
        quantized = quantized_graphs(sources, plain, work, config)
        from specpack.export.tokenizer_export import write_tokenizer

        tokenizer = write_tokenizer(sources.target.model_dir, staging)
        quantized = measured_graphs(sources, quantized, tokenizer, staging, config)
        attached = attached_graphs(sources, quantized, staging, config)
        attached = batched_graphs(sources, quantized, attached, staging, config)
        shutil.rmtree(work)
        write_pack_manifest(staging, config=config, sources=sources, graphs=attached, tokenizer=tokenizer)
        publish(staging, out, config.overwrite)
    _log(f"pack written to {out}")
    return out


def resolve_sources(draft_src: str | None, target_src: str, out: Path, config: ExportConfig) -> Sources:
    """Stage 0: every option checked that can be before a model is touched, the sources resolved to model
    directories (a GGUF file converts, in its own process), a draft head checked against the target, each model's
    config read, the vocabularies compared."""
    _check_draft_source(draft_src, config)
    config.check_sources(draft_src, target_src)
    head_dir = None if config.draft_head is None else Path(config.draft_head).expanduser()
    if head_dir is not None:
        from specpack.heads.head_file import read_head

        read_head(head_dir)  # a head that is no head fails now, not after the target is resolved
    check_destination(out, config.overwrite)
    if config.graphs == "builder":  # before any source is resolved: a GGUF conversion takes minutes
        from specpack.export.builder_export import builder_version

        builder_version()
    srcs: dict[Role, str] = {"target": target_src} if draft_src is None else {"draft": draft_src, "target": target_src}
    methods = {role: config.quantization(role, src) for role, src in reversed(srcs.items())}  # the target's first
    if config.calib_prompts is not None and set(methods.values()) & set(modes.CALIBRATED):
        from specpack.calibration.sets import check_prompt_file

        check_prompt_file(config.calib_prompts)  # a bad file fails now, not after the exports
    # a GGUF source converts to an fp32 model directory (one tensor at a time, about 2 GB for the 1.5B), each in its
    # own process, the two at once: a conversion keeps about one core busy
    unique = list(dict.fromkeys(srcs[role] for role in reversed(srcs)))  # the target's first; one source once
    what = "the target's source" if len(srcs) == 1 else "the two sources at once" if len(unique) == 2 else "the source"
    with phase(f"preparing {what} (a .gguf file converts once to a cached model directory)", _log):
        resolved = dict(zip(unique, _run_stages(resolve_source, config.isolate, [(src,) for src in unique]), strict=True))
    dirs: dict[Role, Path] = {role: resolved[src] for role, src in srcs.items()}
    for model_dir in (dirs.get("draft", dirs["target"]), dirs["target"]):
        require_weights(model_dir)
    head: dict[str, Any] | None = None
    if head_dir is not None:  # refused here, before any export, when it was trained for another target
        _log(f"checking the draft head {head_dir} against the target ...")
        head = _run_stage(_check_head, config.isolate, head_dir, dirs["target"], target_src)
    if config.graphs == "builder":
        from specpack.export.builder_export import check_builder_model

        for role in srcs:
            check_builder_model(dirs[role], role)
    draft_dir = dirs.get("draft", dirs["target"])
    draft_info, target_info = read_model_info(draft_dir), read_model_info(dirs["target"])
    from specpack.export.vocab import check_same_vocabulary

    vocab_size = check_same_vocabulary(draft_dir, dirs["target"], draft_info.vocab_rows, target_info.vocab_rows)
    max_len = config.resolve_max_len(draft_info.max_positions, target_info.max_positions)
    infos = {"draft": draft_info, "target": target_info}
    forms = {role: config.graph_form(infos[role].head_dim) for role in ("draft", "target")}
    models = tuple(Model(role, srcs[role], dirs[role], infos[role], forms[role], methods[role]) for role in srcs)
    return Sources(models=models, vocab_size=vocab_size, max_len=max_len, head_dir=head_dir, head=head)


def plain_graphs(sources: Sources, work: Path, config: ExportConfig) -> PlainGraphs:
    """Stage 1: each model's plain graph, exported with torch (each in its own process, --jobs at once), or built by
    onnxruntime-genai's model builder, which quantizes as it builds (--quantize-* int4 / int8)."""
    graphs: dict[Role, Graph] = {}
    exports: list[tuple[str, Callable[..., None], tuple[object, ...]]] = []  # (its phase, the stage, its arguments)
    for model in sources.models:
        role, model_dir, method = model.role, model.model_dir, model.method
        if config.graphs == "builder":
            with phase(f"building the {role} ({model_dir.name}) with onnxruntime-genai's model builder"
                       + ("" if method == modes.NONE else f", {method} weights"), _log):
                path, record = _run_stage(_build_plain, config.isolate, model_dir, work / f"{role}-builder",
                                          config.dtype, config.execution_provider, method,
                                          sources.taps if role == "target" else (),
                                          config.max_tree_nodes if role == "target" else 0,
                                          role == "draft" and config.draft_tree_width(sources.vocab_size) > 0)
            graphs[role] = Graph(path, record)
            continue
        path = work / f"{role}.onnx"
        draft_tree = role == "draft" and config.draft_tree_width(sources.vocab_size) > 0  # a tree pack's draft model
        exports.append((f"the {role} ({model_dir.name})" + (" in its tree form" if draft_tree else ""), _export_plain,
                        (model_dir, path, config.dtype, model.form, sources.taps if role == "target" else (),
                         config.max_tree_nodes if role == "target" else 0, draft_tree)))
        graphs[role] = Graph(path)
    batched: dict[Role, Graph] = {}
    for model in sources.models if config.max_batch else ():  # before quantizing: it is quantized with the graph
        path = work / f"{model.role}-batched.onnx"
        exports.append((f"the {model.role}'s batched form (--max-batch)", _export_batched_plain,
                        (model.model_dir, path, config.dtype)))
        batched[model.role] = Graph(path)
    jobs = config.jobs if config.isolate else 1
    for i in range(0, len(exports), jobs):
        group = exports[i : i + jobs]
        with phase("exporting " + " and ".join(what for what, _, _ in group)
                   + (f" ({len(group)} at once)" if len(group) > 1 else ""), _log):
            _run_stages_of([(fn, args) for _, fn, args in group], config.isolate)
    return PlainGraphs(graphs, batched)


def quantized_graphs(sources: Sources, plain: PlainGraphs, work: Path, config: ExportConfig) -> QuantizedGraphs:
    """Stage 2: each model's quantization mode applied to its plain graph: weight-only (quantize/stage.py), or
    calibrated Q/DQ from --calib-prompts (calibration/); a graph the builder quantized, or one left unquantized,
    is its plain graph."""
    graphs: dict[Role, Graph] = {}
    batched: dict[Role, Graph] = dict(plain.batched)
    for model in sources.models:
        role, method, graph = model.role, model.method, plain.graphs[model.role]
        if method == modes.NONE or graph.quantization is not None:
            graphs[role] = graph
            continue
        path = work / f"{role}.{method}.onnx"
        from_gguf = model.src.lower().endswith(".gguf") and method in (modes.GGUF, modes.INT4)
        gguf = Path(model.src).expanduser() if from_gguf else None  # int4: its Q4_K blocks are fit, not searched
        with phase(f"quantizing the {role} ({method})" + (" and its batched form" if role in batched else ""), _log):
            if method in modes.CALIBRATED:  # refused with --max-batch (config.py)
                record = _run_stage(_calibrate, config.isolate, graph.path, path, method, model.model_dir, config)
            elif role in batched:  # one process: the batched form takes the batch-1 graph's quantized weights
                batched_path = work / f"{role}-batched.{method}.onnx"
                record, batched_record = _run_stage(_quantize_pair, config.isolate, graph.path, path,
                                                    batched[role].path, batched_path, method, gguf)
                _remove_graph(batched[role].path)  # the unquantized batched form
                batched[role] = Graph(batched_path, batched_record)
            else:
                record = _run_stage(_quantize, config.isolate, graph.path, path, method, gguf)
        graphs[role] = Graph(path, record)
    return QuantizedGraphs(plain, graphs, batched)


def measured_graphs(sources: Sources, quantized: QuantizedGraphs, tokenizer: TokenizerRecord, pack_dir: Path,
                    config: ExportConfig) -> QuantizedGraphs:
    """Stage 3: the quantized graphs measured against the unquantized ones (quantize/fidelity.py); the same graphs,
    each quantization record with its `fidelity` added. Concat-form packs with a draft model only."""
    records = quantized.quantized
    if not records or not config.fidelity:
        return quantized
    if any(model.form.kv_cache != "concat" for model in sources.models):
        _log("fidelity is measured on concat-form graphs only: skipped for this static-form pack")
        return quantized
    if sources.draft is None:  # n-gram packs: no draft to replay with
        return quantized
    with phase("measuring the quantized graphs against the unquantized ones (fidelity; --no-fidelity skips it)", _log):
        fidelity = _run_stage(_fidelity, config.isolate, {r: g.path for r, g in quantized.graphs.items()},
                              {r: g.path for r, g in quantized.plain.graphs.items()}, records, pack_dir,
                              tokenizer.eos_token_ids, config)
    shared = {key: fidelity[key] for key in ("prompts", "prompt_source", "new_tokens")}
    graphs = {role: graph if graph.quantization is None else
              replace(graph, quantization={**graph.quantization, "fidelity": {**fidelity.get(role, {}), **shared}})
              for role, graph in quantized.graphs.items()}
    return QuantizedGraphs(quantized.plain, graphs)


def attached_graphs(sources: Sources, quantized: QuantizedGraphs, pack_dir: Path, config: ExportConfig) -> AttachedGraphs:
    """Stage 4: the sampling and acceptance head on each (quantized) graph: draft_step.onnx, verify.onnx (graphs/);
    a head pack's head_step.onnx from the trained head. The unquantized intermediates are removed."""
    files: dict[Role, str] = {}
    for model in sources.models:
        role, graph = model.role, quantized.graphs[model.role]
        graph_file = DRAFT_STEP_FILE if role == "draft" else VERIFY_FILE
        plain = quantized.plain.graphs[role].path
        if graph.path != plain:
            _remove_graph(plain)  # the unquantized intermediate: only the pack's graphs stay
        with phase(f"attaching the {role}'s sampling and acceptance head ({graph_file})", _log):
            _run_stage(_attach, config.isolate, graph.path, pack_dir / graph_file, role, sources.vocab_size,
                       model.form.heads, config.max_tree_nodes if role == "target" else 0,
                       config.draft_tree_width(sources.vocab_size) if role == "draft" else 0)
        files[role] = graph_file
    if config.max_tree_nodes:  # the tree form's cache compaction (docs/trees.md)
        from specpack.graphs.kv_compact import write_kv_compact
        from specpack.names import KV_COMPACT_FILE

        info = sources.target.info  # a head pack's features cache moves with the KV cache (docs/trees.md)
        feature_dim = 0 if sources.head is None else len(sources.taps) * int(sources.head["config"]["target_hidden"])
        write_kv_compact(pack_dir / KV_COMPACT_FILE, info.num_layers, info.kv_heads, info.head_dim, config.dtype,
                         feature_dim)
    head_file, head_quantization = None, None
    if sources.head_dir is not None:
        head_file = HEAD_STEP_FILE
        attention = head_attention(sources.target.form.attention, config.kv_cache, config.max_tree_nodes,
                                   sources.target.info.head_dim)
        method = config.quantize_draft or modes.NONE
        with phase(f"exporting the draft head's step graph ({attention} attention, weights {method})", _log):
            head_quantization = _run_stage(_export_head, config.isolate, sources.head_dir, sources.target.model_dir,
                                           pack_dir / head_file, config.dtype, sources.vocab_size, config.kv_cache,
                                           config.max_tree_nodes, attention, sources.max_len, method)
    return AttachedGraphs(files=files, quantization={role: g.quantization for role, g in quantized.graphs.items()},
                          head_file=head_file, head_quantization=head_quantization)


def batched_graphs(sources: Sources, quantized: QuantizedGraphs, attached: AttachedGraphs, pack_dir: Path,
                   config: ExportConfig) -> AttachedGraphs:
    """Stage 5 (--max-batch): each model's batched form (stage 1, quantized in stage 2 with the batch-1 graph's
    weights) with its batched head (graphs/attach.py): the target's verify head, the draft's greedy head. A quantized
    form's tensors that equal the batch-1 graph's stay in that graph's data file, already in the pack (stage 4):
    verify.onnx.data / draft_step.onnx.data, read by both graphs; the rest moves to its own data file."""
    if not config.max_batch:
        return attached
    from specpack.names import BATCHED_FILES

    files: dict[Role, str] = {}
    records: dict[Role, dict[str, Any]] = {}
    for model in sources.models:
        role, graph, graph_file = model.role, quantized.batched[model.role], BATCHED_FILES[model.role]
        in_pack: dict[str, str] = {}
        if graph.quantization is not None:  # the batch-1 graph's data file: its work name -> its pack name (attach.py)
            in_pack = {f"{quantized.graphs[role].path.name}.data": f"{attached.files[role]}.data"}
            records[role] = _batched_record(graph.quantization, attached.files[role])
        with phase(f"attaching the {role}'s batched head ({graph_file})", _log):
            _run_stage(_attach_batched, config.isolate, graph.path, pack_dir / graph_file, role, sources.vocab_size,
                       in_pack)
        files[role] = graph_file
    return replace(attached, batched=files, batched_quantization=records)


def _batched_record(record: Mapping[str, Any], graph_file: str) -> dict[str, Any]:
    """The manifest's record of a quantized batched graph: its mode as the model's (the per-tensor list is the
    model's), and what it shares with the batch-1 graph (`graph_file`): weights reused, tensors read from that
    graph's data file. `same_weights`: every quantized weight is the batch-1 graph's."""
    shared = dict(record.get("shared") or {})
    same = shared.get("weights_reused", 0) == shared.get("weights_quantized", -1)
    return {**{k: v for k, v in record.items() if k not in ("tensors", "shared", "seconds")},
            "shared": {**shared, "graph": graph_file, "data_file": f"{graph_file}.data"}, "same_weights": same}


def _export_batched_plain(model_dir: Path, plain: Path, dtype: str = "fp32") -> None:
    """Stage 1 (--max-batch): the batched static form in the pack's dtype (fp32, or fp16: caches in fp16 too)."""
    from specpack.export.batched_export import export_batched_graph

    export_batched_graph(model_dir, plain, dtype)


def _attach_batched(plain: Path, out: Path, role: str, vocab_size: int, in_pack: dict[str, str]) -> None:
    from specpack.graphs.attach import build_batched_greedy_graph, build_batched_verify_graph

    if role == "target":
        build_batched_verify_graph(plain, out, vocab_size, in_pack=in_pack)
    else:
        build_batched_greedy_graph(plain, out, vocab_size, in_pack=in_pack)


def _check_draft_source(draft_src: str | None, config: ExportConfig) -> None:
    drafter = config.drafter
    if config.draft_head is not None:
        if draft_src is not None or drafter != "model":
            found = f"--draft {draft_src}" if draft_src is not None else f"--drafter {drafter}"
            raise SpecpackError("--draft-head makes a pack whose drafter is the head", expected="--draft-head HEAD "
                                "without --draft or --drafter", found=f"--draft-head with {found}")
        return
    if (draft_src is None) != (drafter == "ngram"):
        raise SpecpackError("--draft and --drafter disagree",
                            expected="--draft D (drafter model), or no --draft with --drafter ngram",
                            found=f"--drafter {drafter} "
                            + ("without --draft" if draft_src is None else f"with --draft {draft_src}"))


def _export_plain(model_dir: Path, plain: Path, dtype: str, form: GraphForm, taps: tuple[int, ...] = (),
                  tree_nodes: int = 0, draft_tree: bool = False) -> None:
    """Stage 1: the plain forward graph (torch; the model's memory goes with the process); with `taps`, it also
    outputs the features a draft head reads; tree_nodes > 0: the tree form (torch_export.py); draft_tree: the draft's
    tree form (own rows' positions and mask: a tree pack's draft model)."""
    from specpack.export.torch_export import export_plain_graph

    export_plain_graph(model_dir, plain, dtype, form, taps, tree_nodes, draft_tree)


def _check_head(head_dir: Path, target_dir: Path, target_src: str) -> dict[str, Any]:
    """The head's record, if it was trained for this target (heads/target_hash.py), else a SpecpackError."""
    from specpack.export.head_export import check_head_for_target

    return check_head_for_target(head_dir, target_dir, target_src)


def _export_head(head_dir: Path, target_dir: Path, out: Path, dtype: str, vocab_size: int, kv_cache: str,
                 max_tree_nodes: int = 0, attention: str = "standard", max_len: int = 0,
                 quantize: str = "none") -> dict[str, Any] | None:
    """head_step.onnx from the trained head, in the target's KV form (export/head_export.py); max_tree_nodes > 0:
    its tree form (it drafts token trees); attention: graph_form.head_attention's choice; quantize: int8 / int4
    weight-only (its record returned), or none."""
    from specpack.export.head_export import export_head_step

    return export_head_step(head_dir, target_dir, out, dtype, vocab_size, kv_cache, max_tree_nodes, attention, max_len,
                            quantize)


def _build_plain(model_dir: Path, work: Path, dtype: str, execution_provider: str, method: str,
                 taps: tuple[int, ...] = (), tree_nodes: int = 0,
                 draft_tree: bool = False) -> tuple[Path, dict[str, Any] | None]:
    """Stages 1 and 2 with --graphs builder: onnxruntime-genai's model builder (quantizing as it builds for
    int4 / int8), renamed to our contract; the graph and its quantization record. `taps`: a head pack's target
    also writes the head's features (builder_features.py); tree_nodes > 0: the tree form (builder_tree.py); draft_tree:
    the draft's tree form (builder_tree.add_draft_tree_form)."""
    from specpack.export.builder_export import build_plain_graph

    return build_plain_graph(model_dir, work, dtype, execution_provider, method, taps, tree_nodes, draft_tree)


def _quantize(plain: Path, out: Path, method: str, gguf: Path | None) -> dict[str, Any]:
    """Stage 2: weight-only quantization of any plain graph (quantize/stage.py), `gguf` the file it was exported
    from (gguf: its blocks; int4: its Q4_K blocks fit); returns the manifest record."""
    from specpack.quantize.stage import quantize_plain_graph

    return quantize_plain_graph(plain, out, method, gguf)


def _quantize_pair(plain: Path, out: Path, batched_plain: Path, batched_out: Path, method: str,
                   gguf: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stage 2 of a model with a batched form: both quantized in one process, the batched form with the batch-1
    graph's weights (quantize/stage.py, quantize_graph_pair); both manifest records."""
    from specpack.quantize.stage import quantize_graph_pair

    return quantize_graph_pair(plain, out, batched_plain, batched_out, method, gguf)


def _calibrate(plain: Path, out: Path, method: str, model_dir: Path, config: ExportConfig) -> dict[str, Any]:
    """Stage 2 for int8-sq / fp8: a calibration set from --calib-prompts, then Q/DQ (calibration/qdq.py)."""
    from specpack.calibration.qdq import quantize_calibrated
    from specpack.calibration.sets import calibration_set

    calib = calibration_set(config.calib_prompts or "", config.calib_samples, config.calib_seed, model_dir)
    return quantize_calibrated(plain, out, method, calib)


def _fidelity(graphs: dict[str, Path], plain: dict[str, Path], quantization: dict[str, Any], pack_dir: Path,
              eos_ids: list[int], config: ExportConfig) -> dict[str, Any]:
    """Stage 3: the quantized graphs against the unquantized ones (quantize/fidelity.py)."""
    from specpack.export.tokenizer_export import SUBDIR
    from specpack.quantize.fidelity import FidelityInputs, measure_fidelity, prompt_texts

    ks = tuple(sorted({k for k in (1, 2, 4, 8, config.k) if k <= config.k}))
    inputs = FidelityInputs(
        target=graphs["target"], draft=graphs["draft"],
        target_reference=plain["target"] if "target" in quantization else None,
        draft_reference=plain["draft"] if "draft" in quantization else None,
        tokenizer_dir=pack_dir / SUBDIR, eos_ids=tuple(eos_ids), ks=ks, new_tokens=config.fidelity_tokens)
    return measure_fidelity(inputs, prompt_texts(config.fidelity_prompts, config.fidelity_limit))


def _attach(graph: Path, graph_out: Path, role: str, vocab_size: int, heads: str = "onnxruntime",
            tree_nodes: int = 0, draft_tree_width: int = 0) -> None:
    """Stage 4: the head (`heads`: the form's, graph_form.py) on top of the (quantized) plain graph; its weights
    move to the head graph. tree_nodes > 0: the tree verify head (the target's tree form); draft_tree_width > 0: the
    draft head with each own row's top-K (the draft's tree form)."""
    from specpack.graphs.attach import (
        build_draft_step_graph,
        build_draft_tree_step_graph,
        build_tree_verify_graph,
        build_verify_graph,
    )

    if tree_nodes:
        build_tree_verify_graph(graph, graph_out, vocab_size, tree_nodes)
        return
    if draft_tree_width:
        build_draft_tree_step_graph(graph, graph_out, vocab_size, draft_tree_width)
        return
    build = build_draft_step_graph if role == "draft" else build_verify_graph
    build(graph, graph_out, vocab_size, heads)


def _remove_graph(graph: Path) -> None:
    graph.with_name(f"{graph.name}.data").unlink(missing_ok=True)
    graph.unlink(missing_ok=True)


def _run_stage(fn: Callable[..., T], isolate: bool, *args: object) -> T:
    """Run a stage in a fresh process (its memory is returned when it ends) or in this one."""
    return run_isolated(fn, *args) if isolate else fn(*args)


def _run_stages(fn: Callable[..., T], isolate: bool, args: list[tuple[object, ...]]) -> list[T]:
    """`fn` on each of `args`: in fresh processes, all at once, or one after another in this one."""
    return _run_stages_of([(fn, a) for a in args], isolate)


def _run_stages_of(calls: list[tuple[Callable[..., Any], tuple[object, ...]]], isolate: bool) -> list[Any]:
    """Each (stage, its arguments): in fresh processes, all at once, or one after another in this one."""
    return run_isolated_all(calls) if isolate else [fn(*args) for fn, args in calls]


def _log(message: str) -> None:
    print(f"[spec-export] {message}", file=sys.stderr, flush=True)


__all__ = ["ExportConfig", "ModelInfo", "export_pack"]
