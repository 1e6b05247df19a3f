"""Write manifest.json for a staged pack: every file with its sha256, each graph with its I/O spec."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from specpack import __version__
from specpack.contract.manifest import (
    MANIFEST_FILE,
    TREE_RULES,
    FileEntry,
    GraphEntry,
    HeadEntry,
    Manifest,
    ModelEntry,
    TensorSpec,
    parse_manifest,
    schema_error,
)
from specpack.export.graph_form import head_attention
from specpack.hashing import sha256_file
from specpack.names import HEAD_STEP_FILE

if TYPE_CHECKING:
    from specpack.export.config import ExportConfig
    from specpack.export.graph_form import GraphForm
    from specpack.export.stages import AttachedGraphs, Model, QuantizationRecord, Sources
    from specpack.export.tokenizer_export import TokenizerRecord


def write_pack_manifest(pack_dir: Path, *, config: ExportConfig, sources: Sources, graphs: AttachedGraphs,
                        tokenizer: TokenizerRecord) -> Manifest:
    """Validated against the schema before it is written: a pack the reader would refuse is never written.
    From the export's stage records (export/stages.py): `sources` (the models; no draft: drafter "ngram", or "head"
    with sources.head, head.json's record, for a pack with head_step.onnx), `graphs` (the pack's graph files and
    each model's quantization record); config.plain_graph_record() says how the plain graphs were made."""
    try:
        manifest = _manifest(pack_dir, config=config, sources=sources, graphs=graphs, tokenizer=tokenizer)
    except ValidationError as err:
        raise schema_error(err, "the export produced a manifest that does not match the pack schema") from None
    parse_manifest(manifest.to_json().encode())  # the reader takes exactly what is written
    manifest.write(pack_dir)
    return manifest


def _manifest(pack_dir: Path, *, config: ExportConfig, sources: Sources, graphs: AttachedGraphs,
              tokenizer: TokenizerRecord) -> Manifest:
    files = [FileEntry(path=p.relative_to(pack_dir).as_posix(), sha256=sha256_file(p), size=p.stat().st_size)
             for p in sorted(pack_dir.rglob("*")) if p.is_file() and p.name != MANIFEST_FILE and not p.name.startswith(".")]
    graph_record = config.plain_graph_record()
    models = {model.role: _model_entry(pack_dir, graphs.files[model.role], model, config.dtype,
                                       graphs.quantization.get(model.role), graph_record,
                                       config.max_tree_nodes if model.role == "target" else 0,
                                       _batched(pack_dir, graphs.batched.get(model.role), model.role, config.max_batch,
                                                graphs.batched_quantization.get(model.role)),
                                       config.draft_tree_width(sources.vocab_size) if model.role == "draft" else 0)
              for model in sources.models}
    head = sources.head
    return Manifest(
        drafter="model" if sources.draft is not None else "head" if head is not None else "ngram",
        head=None if head is None else head_entry(pack_dir, head, config.dtype, graphs.head_file or HEAD_STEP_FILE,
                                                 config.kv_cache, config.max_tree_nodes,
                                                 head_attention(sources.target.form.attention, config.kv_cache,
                                                                config.max_tree_nodes, sources.target.info.head_dim),
                                                 graphs.head_quantization),
        draft=models.get("draft"),
        target=models["target"],
        vocab_size=sources.vocab_size,
        eos_token_ids=sorted(tokenizer.eos_token_ids),
        k_max=config.k,
        max_len=sources.max_len,
        tokenizer_files=tokenizer.files,
        has_chat_template=tokenizer.has_chat_template,
        files=files,
        specpack_version=__version__,
    )


def head_entry(pack_dir: Path, record: Mapping[str, Any], dtype: str, graph_file: str = HEAD_STEP_FILE,
               kv_cache: str = "concat", max_tree_nodes: int = 0, attention: str = "standard",
               quantization: Mapping[str, Any] | None = None) -> HeadEntry:
    """The manifest's head entry from head.json's record: what the runtime needs typed, the training record kept;
    kv_cache: the head graph's form (the target's: export/head_export.py); max_tree_nodes > 0: its tree form;
    attention: graph_form.head_attention's choice; quantization: head_step.onnx's weight-only record, if any."""
    from specpack.export.head_export import tree_width

    config = record["config"]
    losses = record.get("losses") or []
    return HeadEntry.model_validate({
        "kind": record["kind"],
        "graph": graph_entry(pack_dir, graph_file, _head_form(kv_cache, attention)), "dtype": dtype, "taps": config["taps"],
        "feature_dim": config["target_hidden"] * len(config["taps"]), "hidden": config["hidden"],
        "kv_heads": config["kv_heads"], "head_dim": config["head_dim"], "subset_size": config["subset_size"],
        "tree_width": tree_width(max_tree_nodes, config["subset_size"]), "quantization": quantization,
        "subset_sha256": record["subset_sha256"], "weights_sha256": record["weights_sha256"],
        "target_weights_sha256": record["target"]["weights_sha256"],
        "data": [{"name": d["name"], "tokens": d["tokens"], "sha256": d["sha256"]} for d in record.get("data", [])],
        "target_source": record["target"].get("source"), "recipe": record.get("recipe", {}),
        "training": record.get("training", {}), "losses": {"first": losses[0], "last": losses[-1]} if losses else {}})


def _head_form(kv_cache: str, attention: str) -> GraphForm:
    from specpack.export.graph_form import GraphForm

    return GraphForm(kv_cache, attention, "onnxruntime")


def _batched(pack_dir: Path, graph_file: str | None, role: str, max_batch: int,
             quantization: QuantizationRecord | None = None) -> dict[str, Any] | None:
    """The model entry's `batched` record (contract BatchedForm) of its batched graph, if the export wrote one;
    `quantization`: a quantized one's record (pipeline.py, _batched_record)."""
    from specpack import names
    from specpack.export.graph_form import GraphForm

    if graph_file is None:
        return None
    head = "verify" if role == "target" else "greedy"
    inputs = [names.DRAFT_COUNTS, names.TOKEN_COUNTS]  # both heads read each row's last k_b + 1 positions
    return {"max_batch": max_batch, "head": head, "inputs": inputs,
            "graph": graph_entry(pack_dir, graph_file, GraphForm("static", "standard", "onnxruntime")),
            "quantization": None if quantization is None else dict(quantization)}


def _model_entry(pack_dir: Path, graph_file: str, model: Model, dtype: str, quantization: QuantizationRecord | None,
                 graph_record: dict[str, str] | None = None, tree_nodes: int = 0,
                 batched: dict[str, Any] | None = None, tree_width: int = 0) -> ModelEntry:
    """tree_nodes > 0: the target's tree verify graph; tree_width > 0: the draft's tree form (K of its TopK)."""
    info = model.info
    return ModelEntry.model_validate({
        "source": model.record(), "model_type": info.model_type, "num_layers": info.num_layers,
        "kv_heads": info.kv_heads, "head_dim": info.head_dim, "vocab_rows": info.vocab_rows,
        "max_positions": info.max_positions, "dtype": dtype,
        "graph": graph_entry(pack_dir, graph_file, model.form, graph_record, tree_nodes),
        "quantization": None if quantization is None else dict(quantization), "batched": batched,
        **({"tree_width": tree_width} if tree_width else {})})


def graph_entry(pack_dir: Path, graph_file: str, form: GraphForm | None = None,
                graph_record: dict[str, str] | None = None, tree_nodes: int = 0) -> GraphEntry:
    """I/O spec, external data files and form (None: concat) of a graph, read without loading its weights.
    `positions` says whether the graph takes position_ids ("inputs") or computes them from the static mask
    ("internal": the builder's GroupQueryAttention); graph_record: `exporter` / `execution_provider`;
    tree_nodes > 0: a tree verify graph, with kv_compact.onnx beside it (`tree`)."""
    import onnx

    from specpack import names

    tree = {}
    if tree_nodes:
        compact = onnx.load(str(pack_dir / names.KV_COMPACT_FILE), load_external_data=False)
        tree = {"tree": {"max_nodes": tree_nodes, "rules": list(TREE_RULES), "kv_compact": {
            "path": names.KV_COMPACT_FILE, "inputs": [_spec(v) for v in compact.graph.input],
            "outputs": [_spec(v) for v in compact.graph.output]}}}
    model = onnx.load(str(pack_dir / graph_file), load_external_data=False)
    data_files = sorted({entry.value for init in model.graph.initializer for entry in init.external_data
                         if entry.key == "location"})
    form_fields = {"kv_cache": form.kv_cache, "attention": form.attention, "heads": form.heads} if form else {}
    takes_positions = any(v.name == names.POSITION_IDS for v in model.graph.input)
    return GraphEntry.model_validate({
        "path": graph_file, "data_files": data_files, "inputs": [_spec(v) for v in model.graph.input],
        "outputs": [_spec(v) for v in model.graph.output], **form_fields,
        "positions": "inputs" if takes_positions else "internal", **(graph_record or {}), **tree})


def _spec(value: Any) -> TensorSpec:
    import onnx

    tensor = value.type.tensor_type
    shape: list[int | str] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
    return TensorSpec(name=value.name, dtype=onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name, shape=shape)
