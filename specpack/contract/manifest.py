"""The pack manifest, defined once: a typed, bounded schema (pydantic) that the writer and every reader use.

    PACK/manifest.json  --read_manifest_bytes-->  bytes (size-capped, inside the pack, optionally pinned by sha256)
                        --parse_json-->           JSON (no duplicate keys, NaN, deep nesting or lone surrogates)
                        --Manifest.model_validate(strict)-->  Manifest (every field typed and bounded, cross-checked)

Any problem is a SpecpackError naming the field. `python -m specpack.contract.schema` writes the same schema as
JSON Schema (docs/manifest.schema.json) for other tools; the cross-field rules (the `_check_*` validators
below) are listed in its description.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator

from specpack import names
from specpack.dtypes import GRAPH_DTYPES, DtypeName
from specpack.errors import SpecpackError
from specpack.limits import K_MAX, TREE_NODES_MAX, QuantizationMode

SCHEMA_VERSION: Final = 1
MANIFEST_FILE = "manifest.json"
MANIFEST_BYTES_LIMIT = 16 << 20   # the real Qwen2.5-Coder pack's manifest is 53 KB
JSON_DEPTH_LIMIT = 24             # the schema nests 6 deep; free-form quantization details get the rest
JSON_NODES_LIMIT = 1 << 20
MAX_LEN_LIMIT = 1 << 18           # 262,144 positions: KV buffers are allocated for max_len up front
VOCAB_LIMIT = 1 << 22
DIM_LIMIT = 1 << 16
SIZE_LIMIT = 1 << 50              # bytes in one file
ERRORS_SHOWN = 5
TOKENIZER_FILES = tuple(f"{names.TOKENIZER_DIR}/{f}" for f in names.TOKENIZER_LOADED_FILES)  # what the runtime's tokenizer opens
HEAD_INPUTS = (names.INPUT_IDS, names.FEATURES, names.DRAFT_IDS, names.HIDDEN_IN, names.TEMPERATURE, names.TOP_K,
               names.TOP_P, names.UNIFORM)  # head_step.onnx, besides its KV cache (names.py, "Head packs")
HEAD_OUTPUTS = (names.TOKEN, names.PROBS, names.HIDDEN_OUT)
TREE_HEAD_INPUTS = (names.DRAFT_POSITIONS, names.DRAFT_MASK)  # a head's or draft model's tree form adds (docs/trees.md)
TREE_HEAD_OUTPUTS = (names.TREE_TOKENS, names.TREE_LOGPROBS, names.TREE_HIDDEN)
ROLE_IO = {  # what the runtime binds by name in each graph, besides the plain inputs and the KV cache
    "draft": ({names.UNIFORM}, {names.TOKEN, names.PROBS}),
    "target": ({names.DRAFT_PROBS, names.UNIFORMS}, {names.N_ACCEPTED, names.NEXT_TOKEN}),
    "tree": ({names.PARENTS, names.UNIFORMS}, {names.N_ACCEPTED, names.NEXT_TOKEN, names.PATH}),  # a tree verify
}
# (kv_cache, heads, positions, exporter) of the graphs a tree verify graph is made from: the torch tree form
# (export/torch_export.py) and the builder's (export/builder_tree.py: positions from the mask, as its GQA takes them)
TREE_FORMS = (("static", "onnxruntime", "inputs", "torch"), ("static", "onnxruntime", "internal", "builder"))
TREE_RULES = ("greedy", "deterministic")  # the acceptance rules a tree verify head has (graphs/tree_head.py)
PLAIN_INPUTS = {names.INPUT_IDS, names.ATTENTION_MASK, names.TEMPERATURE, names.TOP_K, names.TOP_P}
POSITION_INPUTS = {"inputs": {names.POSITION_IDS}, "internal": set()}  # GraphEntry.positions -> the inputs it adds

_UNPRINTABLE = "\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029\\ud800-\\udfff"  # controls, line separators, lone surrogates
_PRINTABLE = re.compile(f"[^{_UNPRINTABLE}]*")
_PART = f"(?!\\.\\.?(?:/|$))[^/\\\\{_UNPRINTABLE}]+"  # a path part: not "." or "..", no "/" or "\\"
# relative POSIX path inside the pack: parts joined by "/", the first without ":" (no drive letters or URLs)
_REL_PATH = re.compile(f"(?![^/]*:){_PART}(?:/{_PART})*")


def _relative_posix_path(path: str) -> str:
    if not _REL_PATH.fullmatch(path):
        raise ValueError("must be a relative POSIX path inside the pack (no leading '/', '..', '.', '\\', "
                         "empty parts, drive letters or control characters)")
    return path


def _printable(text: str) -> str:
    if not _PRINTABLE.fullmatch(text):
        raise ValueError("must not contain control characters or lone surrogates")
    return text


RelPath = Annotated[str, Field(min_length=1, max_length=512, json_schema_extra={"pattern": f"^{_REL_PATH.pattern}$"}),
                    AfterValidator(_relative_posix_path)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Name = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[\x20-\x7e]+$")]  # printable ASCII
Text = Annotated[str, Field(max_length=4096, json_schema_extra={"pattern": f"^{_PRINTABLE.pattern}$"}),
                 AfterValidator(_printable)]
Dim = Annotated[int, Field(ge=1, le=DIM_LIMIT)]


class _Closed(BaseModel):
    """Unknown fields are refused; instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _Open(BaseModel):
    """Typed fields plus free-form JSON details (for stages that add records later)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    __pydantic_extra__: dict[str, JsonValue] = Field(init=False)


class TensorSpec(_Closed):
    """One graph input or output: name, element type ("float32", "int64", ...) and shape (sizes or symbols)."""

    name: Name
    dtype: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
    shape: list[Annotated[int, Field(ge=0, le=1 << 40)] | Name] = Field(max_length=16)


class FileEntry(_Closed):
    """A file of the pack, relative to the pack root."""

    path: RelPath
    sha256: Sha256
    size: Annotated[int, Field(ge=0, le=SIZE_LIMIT)]


class GraphEntry(_Closed):
    """A graph the runtime loads: its .onnx file, its external data files, its I/O and its form
    (export/graph_form.py): KV cache "concat" | "static", attention "standard" | "gqa". `positions`: whether
    the runtime feeds position_ids ("inputs") or the graph computes them from the static mask ("internal":
    onnxruntime-genai's model builder graphs, whose GroupQueryAttention applies the rotary). `exporter`: who
    wrote the plain graph, torch (torch.onnx.export) or onnxruntime-genai's model builder ("builder"), and for
    builder graphs the execution provider they were built for."""

    path: RelPath
    data_files: list[RelPath] = Field(max_length=4096)
    inputs: list[TensorSpec] = Field(max_length=4096)
    outputs: list[TensorSpec] = Field(max_length=4096)
    kv_cache: Literal["concat", "static"] = "concat"     # concat: present = past + new; static: buffers of max_len
    attention: Literal["standard", "gqa"] = "standard"  # export/graph_form.py
    heads: Literal["onnxruntime", "tensorrt"] = "onnxruntime"  # tensorrt: TensorRT's ops in the heads (--form)
    positions: Literal["inputs", "internal"] = "inputs"  # internal: no position_ids input (static cache only)
    exporter: Literal["torch", "builder"] = "torch"      # builder: onnxruntime-genai's model builder (--graphs)
    execution_provider: Literal["cpu", "cuda"] | None = None  # what a builder graph was built for (--ep)
    tree: TreeForm | None = None                         # a tree verify graph (--max-tree-nodes); None: chains

    @model_validator(mode="after")
    def _check_origin(self) -> GraphEntry:
        # positions "internal" with the static cache: checked on model entries (a head's concat graph computes its own)
        form = (self.kv_cache, self.heads, self.positions, self.exporter)
        if self.tree is not None and form not in TREE_FORMS:
            raise ValueError("a tree verify graph has kv_cache 'static' and heads 'onnxruntime', and is a torch graph "
                             "with positions 'inputs' or a builder graph with positions 'internal'")
        if (self.exporter == "builder") != (self.execution_provider is not None):
            raise ValueError("execution_provider is recorded exactly for exporter 'builder'")
        return self

    def runtime_inputs(self) -> set[str]:
        """The plain inputs the runtime feeds this graph (besides the KV cache and the head's inputs)."""
        return PLAIN_INPUTS | POSITION_INPUTS[self.positions]


class KvCompactGraph(_Closed):
    """kv_compact.onnx of a tree pack (graphs/kv_compact.py): attention_mask, path and past.* in, present.* out."""

    path: RelPath
    inputs: list[TensorSpec] = Field(max_length=4096)
    outputs: list[TensorSpec] = Field(max_length=4096)


class TreeForm(_Closed):
    """A tree verify graph (docs/trees.md): verify.onnx takes `parents` [1, T] (T <= max_nodes) in place of
    draft_probs and gives `path` [1, T + 1]; after each verify the runtime runs `kv_compact` over that path."""

    max_nodes: Annotated[int, Field(ge=1, le=TREE_NODES_MAX)]
    rules: list[Literal["greedy", "deterministic"]] = Field(min_length=1, max_length=len(TREE_RULES))
    kv_compact: KvCompactGraph


class BatchedForm(_Closed):
    """A model's batched graph (spec-export --max-batch; docs/batching.md, "The batched graph form"): the static
    standard-attention form with a batch axis, rows right-padded, each with its own mask row and KV slot. `head`:
    "verify" (graphs/batched_head.py: draft_counts, token_counts and per-row sampling inputs -> n_accepted,
    next_token [B]) or "greedy" (draft_counts, token_counts -> best [B, K+1], the argmax at each row's last k_b + 1
    positions: the batched greedy draft; [B, S], every position, with no inputs of its own before 2026-12-06).
    `inputs`: the batch-only inputs besides the batch-1 graph's. Absent (None) on older packs and packs exported
    without --max-batch: batch 1 only.
    `quantization`: how its weights are stored, the model's method (quantize/stage.py, quantize_graph_pair: the
    batch-1 graph's quantized weights; `shared` says how many, and which data file the two graphs both read; the
    per-tensor list is the model's); None: unquantized, as the model."""

    form: Literal["standard-static"] = "standard-static"
    max_batch: Annotated[int, Field(ge=1, le=1024)]
    padding: Literal["right"] = "right"
    head: Literal["verify", "greedy"]
    inputs: list[Name] = Field(default_factory=list, max_length=16)
    graph: GraphEntry
    quantization: Quantization | None = None

    @model_validator(mode="after")
    def _check_graph(self) -> BatchedForm:
        g = self.graph
        if (g.kv_cache, g.attention, g.heads, g.positions, g.exporter, g.tree) != \
                ("static", "standard", "onnxruntime", "inputs", "torch", None):
            raise ValueError("a batched graph is a torch graph of kv_cache 'static', attention 'standard', heads "
                             "'onnxruntime', positions 'inputs' and no tree")
        want = {"verify": {names.N_ACCEPTED, names.NEXT_TOKEN}, "greedy": {names.BEST}}[self.head]
        if not want <= {s.name for s in g.outputs} or not set(self.inputs) <= {s.name for s in g.inputs}:
            raise ValueError(f"a batched {self.head} graph's outputs must include {sorted(want)}, its inputs the "
                             f"batch inputs {self.inputs}")
        return self


class Fidelity(_Open):
    """How close the quantized model stays to the unquantized one (measured at export)."""

    alpha: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    tau: Annotated[float, Field(ge=0, le=1 << 10, allow_inf_nan=False)] | None = None
    top1_agreement: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    mean_kl: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None  # KL(unquantized || quantized)


class Calibration(_Open):
    """What calibration ran on, so it can be repeated."""

    method: Name
    samples: Annotated[int, Field(ge=0, le=1 << 31)] = 0
    dataset_sha256: Sha256 | None = None
    versions: dict[Name, Name] = Field(default_factory=dict, max_length=64)  # library -> version


class QuantizedTensor(_Open):
    """What one weight became (quantize/stage.py): its tensor, the path it took (e.g. "int4", "kept",
    "gguf-exact Q4_K"), and free-form details (shape, block size, why it was kept)."""

    tensor: Name
    path: Name


class Quantization(_Open):
    """How a model's weights are stored (quantize/stage.py writes it); later methods add extra JSON fields."""

    method: QuantizationMode          # quantize/modes.py
    bits: Annotated[int, Field(ge=1, le=32)] | None = None
    block_size: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    accuracy_level: Annotated[int, Field(ge=0, le=16)] | None = None
    tensors: list[QuantizedTensor] = Field(default_factory=list, max_length=1 << 16)
    summary: dict[Name, Annotated[int, Field(ge=0)]] = Field(default_factory=dict, max_length=256)  # path -> weights
    fidelity: Fidelity | None = None
    calibration: Calibration | None = None


class SourceRecord(_Closed):
    """Where a model came from (informational: the runtime never opens these paths)."""

    source: Text
    resolved: Text | None = None
    model_type: Name | None = None
    files: dict[Annotated[Text, Field(min_length=1)], Sha256] = Field(default_factory=dict, max_length=4096)


class ModelEntry(_Closed):
    """One model: where it came from, the cache geometry the runtime allocates for, and its graph."""

    source: SourceRecord
    model_type: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    num_layers: Annotated[int, Field(ge=1, le=1024)]
    kv_heads: Annotated[int, Field(ge=1, le=1024)]
    head_dim: Annotated[int, Field(ge=1, le=4096)]
    vocab_rows: Annotated[int, Field(ge=1, le=VOCAB_LIMIT)]
    max_positions: Annotated[int, Field(ge=2, le=1 << 31)] | None
    dtype: DtypeName
    quantization: Quantization | None = None  # None: the graph as exported (quantize/stage.py, fidelity.py)
    graph: GraphEntry
    batched: BatchedForm | None = None  # --max-batch: the batched graph beside `graph` (None: batch 1 only)
    tree_width: Annotated[int, Field(ge=0, le=64)] = 0  # > 0: a tree pack's draft model in its tree form (own rows'
    # positions and mask in, each row's top-K out: docs/trees.md, "Trees drafted by the draft model"): K of its TopK

    @model_validator(mode="after")
    def _check_kv_cache_io(self) -> ModelEntry:
        """The graph's KV inputs and outputs are exactly the ones the runtime binds, shaped as declared."""
        g = self.graph
        if g.positions == "internal" and g.kv_cache != "static":
            raise ValueError("positions 'internal' needs kv_cache 'static' (the positions come from the static mask)")
        for specs, prefix in ((g.inputs, "past"), (g.outputs, "present")):
            want = names.kv_names(self.num_layers, prefix)
            have = {s.name: s for s in specs if s.name.startswith(want[0].split(".")[0] + ".")}
            if set(have) != set(want):
                raise ValueError(f"{prefix} KV tensors of the graph do not match num_layers {self.num_layers}: "
                                 f"expected {want[0]} .. {want[-1]}, found {len(have)} such tensors")
            for spec in have.values():
                _check_kv_spec(spec, self)
        if g.tree is not None:
            compact = g.tree.kv_compact
            features = names.PAST_TARGET_FEATURES in {s.name for s in g.inputs}  # a head pack's features cache
            want_in = {names.ATTENTION_MASK, names.PATH, *names.kv_names(self.num_layers, "past"),
                       *([names.PAST_TARGET_FEATURES] if features else [])}
            want_out = {*names.kv_names(self.num_layers, "present"), *([names.TARGET_FEATURES] if features else [])}
            if {s.name for s in compact.inputs} != want_in or {s.name for s in compact.outputs} != want_out:
                raise ValueError(f"tree.kv_compact's inputs must be {names.ATTENTION_MASK}, {names.PATH} and the past "
                                 f"KV tensors, its outputs the present KV tensors (num_layers {self.num_layers}), "
                                 "and the features cache where the verify graph takes one")
            for spec in [*compact.inputs, *compact.outputs]:
                if spec.name.startswith(("past_key_values.", "present.")):
                    _check_kv_spec(spec, self)
        if self.tree_width:  # the draft's tree form: own rows' positions and mask in, each row's top-K out
            names_in, names_out = {s.name for s in g.inputs}, {s.name for s in g.outputs}
            if g.kv_cache != "static" or not set(TREE_HEAD_INPUTS) <= names_in or \
                    not {names.TREE_TOKENS, names.TREE_LOGPROBS} <= names_out:
                raise ValueError(f"a model's tree form (tree_width {self.tree_width}) has kv_cache 'static', inputs "
                                 f"{list(TREE_HEAD_INPUTS)} and outputs {[names.TREE_TOKENS, names.TREE_LOGPROBS]}")
        if self.batched is not None:
            batched = self.batched.graph
            for specs, prefix in ((batched.inputs, "past"), (batched.outputs, "present")):
                if not set(names.kv_names(self.num_layers, prefix)) <= {s.name for s in specs}:
                    raise ValueError(f"the batched graph lacks {prefix} KV tensors of num_layers {self.num_layers}")
                for spec in specs:  # its caches in the model's dtype and geometry (the runtime allocates them so)
                    if spec.name.startswith(("past_key_values.", "present.")):
                        _check_kv_spec(spec, self)
            methods = [q.method if q is not None else "none" for q in (self.quantization, self.batched.quantization)]
            if methods[0] != methods[1]:
                raise ValueError(f"the batched graph's quantization ({methods[1]}) is not the model's ({methods[0]})")
        for specs in (g.inputs, g.outputs):
            seen = [s.name for s in specs]
            if len(seen) != len(set(seen)):
                raise ValueError("graph input or output names repeat")
        return self


def _check_kv_spec(spec: TensorSpec, model: ModelEntry | HeadEntry) -> None:
    element = GRAPH_DTYPES[model.dtype].element  # the KV cache's element type
    if spec.dtype != element:
        raise ValueError(f"{spec.name} is {spec.dtype}, while dtype {model.dtype} needs {element}")
    if len(spec.shape) != 4:
        raise ValueError(f"{spec.name} has {len(spec.shape)} dims, expected 4 [batch, kv_heads, length, head_dim]")
    heads, dim = spec.shape[1], spec.shape[3]
    if (isinstance(heads, int) and heads != model.kv_heads) or (isinstance(dim, int) and dim != model.head_dim):
        raise ValueError(f"{spec.name} has shape {spec.shape}, while kv_heads is {model.kv_heads} "
                         f"and head_dim {model.head_dim}")


class HeadData(_Open):
    """One part of a head's training data: its name ("stdlib", "self", "text:FILE", "prompts:FILE"), its tokens and
    the sha256 of its token ids (int32, little-endian)."""

    name: Text
    tokens: Annotated[int, Field(ge=0, le=1 << 40)]
    sha256: Sha256


class HeadEntry(_Open):
    """A draft head (spec-export --draft-head; docs/heads.md): head_step.onnx (one decoder layer, its KV cache in the
    graph's `kv_cache` form: concat, or static with the static attention_mask; positions computed in the graph) and
    what it was trained as. The target graph outputs `target_features`: [1, S, feature_dim] (concat), or the features
    cache [1, 1, M, feature_dim] written in place from `past_target_features` (static), the inputs of the `taps`
    layers; `target_weights_sha256` is the hash of the target weights
    the head was trained on (checked at export). Training details (recipe, losses, settings) are free-form extras."""

    kind: Literal["eagle3"]
    graph: GraphEntry
    dtype: Literal["fp32", "fp16", "bf16"]
    taps: list[Annotated[int, Field(ge=0, le=1024)]] = Field(min_length=1, max_length=16)
    feature_dim: Dim
    hidden: Dim
    kv_heads: Annotated[int, Field(ge=1, le=1024)]
    head_dim: Annotated[int, Field(ge=1, le=4096)]
    subset_size: Annotated[int, Field(ge=1, le=VOCAB_LIMIT)]
    subset_sha256: Sha256
    weights_sha256: Sha256            # of the head's head.safetensors
    target_weights_sha256: Sha256     # heads/target_hash.py
    data: list[HeadData] = Field(max_length=256)
    tree_width: Annotated[int, Field(ge=0, le=64)] = 0  # > 0: the tree form (a tree pack's head): K of its TopK
    quantization: Quantization | None = None  # head_step.onnx's weights (--quantize-draft int8 / int4); None: as exported

    @model_validator(mode="after")
    def _check_io(self) -> HeadEntry:
        """head_step.onnx takes exactly what the runtime binds and gives what it reads, shaped as declared."""
        inputs = {s.name: s for s in self.graph.inputs}
        outputs = {s.name: s for s in self.graph.outputs}
        want_in = set(HEAD_INPUTS) | set(names.kv_names(1, "past"))
        if self.graph.kv_cache == "static":  # the static mask says where the run's rows go
            want_in.add(names.ATTENTION_MASK)
        want_out = set(HEAD_OUTPUTS) | set(names.kv_names(1, "present"))
        if self.tree_width:  # the tree form: own rows' positions and mask in, each row's top-K out
            if self.graph.kv_cache != "static":
                raise ValueError("a head's tree form (tree_width > 0) needs kv_cache 'static'")
            want_in |= set(TREE_HEAD_INPUTS)
            want_out |= set(TREE_HEAD_OUTPUTS)
        if set(inputs) != want_in or not want_out <= set(outputs):
            raise ValueError(f"the head graph's I/O is not the contract's: expected inputs {sorted(want_in)} and outputs "
                             f"{sorted(want_out)}, found inputs {sorted(inputs)[:12]} and outputs {sorted(outputs)[:12]}")
        for name in (*names.kv_names(1, "past"), *names.kv_names(1, "present")):
            _check_kv_spec(inputs.get(name) or outputs[name], self)
        for spec, width in ((inputs[names.FEATURES], self.feature_dim), (inputs[names.HIDDEN_IN], self.hidden),
                            (outputs[names.HIDDEN_OUT], self.hidden)):
            if spec.shape and isinstance(spec.shape[-1], int) and spec.shape[-1] != width:
                raise ValueError(f"the head graph's {spec.name} has shape {spec.shape}, expected last dim {width}")
        if self.feature_dim % len(self.taps):
            raise ValueError(f"feature_dim {self.feature_dim} is not a multiple of the {len(self.taps)} taps")
        return self


class EngineEntry(_Closed):
    """A prebuilt engine (executable code): loaded only when listed here, and only after its hash is checked."""

    path: RelPath
    role: Literal["draft", "target"]
    backend: Literal["tensorrt"]
    gpu: Text                                                       # e.g. "NVIDIA H200"
    compute_capability: Annotated[str, Field(pattern=r"^[0-9]{1,2}\.[0-9]{1,2}$")]
    tensorrt_version: Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+){0,3}$")]
    precision: Literal["fp32", "fp16", "bf16", "int8", "fp8"] | None = None  # `specpack build --precision`


class Manifest(_Closed):
    """What a pack holds. Field `draft` is absent when `drafter` is "ngram" (a pack without a draft model)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    specpack_version: Annotated[str, Field(max_length=64, pattern=r"^[\x20-\x7e]*$")] = ""
    drafter: Literal["model", "ngram", "head"] = "model"
    draft_model: ModelEntry | None = Field(default=None, alias="draft")
    target: ModelEntry
    head: HeadEntry | None = None  # present exactly when drafter is "head" (docs/heads.md)
    vocab_size: Annotated[int, Field(ge=1, le=VOCAB_LIMIT)]  # the logits width both graphs use
    eos_token_ids: list[Annotated[int, Field(ge=0)]] = Field(min_length=1, max_length=256)
    k_max: Annotated[int, Field(ge=1, le=K_MAX)]
    max_len: Annotated[int, Field(ge=2, le=MAX_LEN_LIMIT)]
    tokenizer_files: list[RelPath] = Field(min_length=1, max_length=64)
    has_chat_template: bool
    files: list[FileEntry] = Field(min_length=1, max_length=1 << 16)
    backends: list[Annotated[str, Field(pattern=r"^[a-z0-9_.-]{1,32}$")]] = Field(
        default_factory=lambda: ["onnxruntime"], min_length=1, max_length=16)
    engines: list[EngineEntry] = Field(default_factory=list, max_length=256)

    @model_validator(mode="before")
    @classmethod
    def _drop_legacy_fields(cls, data: Any) -> Any:
        """Packs written before per-model quantization carry `"quantization": null` at the top: it meant none."""
        if isinstance(data, dict) and "quantization" in data and data["quantization"] is None:
            return {key: value for key, value in data.items() if key != "quantization"}
        return data

    @model_validator(mode="after")
    def _check_consistency(self) -> Manifest:
        if (self.draft_model is None) != (self.drafter != "model"):
            raise ValueError(f"drafter {self.drafter!r} needs " + ("a draft model entry" if self.drafter == "model"
                                                                   else "no draft model entry"))
        if (self.head is None) != (self.drafter != "head"):
            raise ValueError(f"drafter {self.drafter!r} needs " + ("a head entry" if self.drafter == "head"
                                                                   else "no head entry"))
        if self.head is not None:
            _check_head(self.head, self.target, self.vocab_size)
        for role, model in self.models():
            if role == "draft" and model.graph.tree is not None:
                raise ValueError("only the target's graph can be a tree verify graph")
            if model.tree_width and (role != "draft" or self.target.graph.tree is None):
                raise ValueError(f"only a tree pack's draft model has the tree form (tree_width {model.tree_width}): "
                                 f"found it on the {role}"
                                 + (" of a pack whose target verifies no trees" if self.target.graph.tree is None
                                    else ""))
            _check_graph_names(role, model, self.vocab_size)
            if model.vocab_rows < self.vocab_size:
                raise ValueError(f"vocab_size {self.vocab_size} is larger than the {role}'s vocab_rows {model.vocab_rows}")
            if model.max_positions is not None and self.max_len > model.max_positions:
                raise ValueError(f"max_len {self.max_len} is past the {role}'s position limit {model.max_positions}")
        bad_eos = [i for i in self.eos_token_ids if i >= self.vocab_size]
        if bad_eos:
            raise ValueError(f"eos_token_ids {bad_eos[:5]} are outside the vocabulary [0, {self.vocab_size})")
        _check_files(self)
        return self

    @property
    def draft(self) -> ModelEntry:
        """The draft model; a SpecpackError for a pack without one (drafter "ngram")."""
        if self.draft_model is None:
            raise SpecpackError("this pack has no draft model", expected="a pack with drafter 'model'",
                                found=f"drafter {self.drafter!r}")
        return self.draft_model

    def models(self) -> list[tuple[str, ModelEntry]]:
        """(role, entry) of each model in the pack: the draft (when there is one), then the target."""
        return [(role, m) for role, m in (("draft", self.draft_model), ("target", self.target)) if m is not None]

    @property
    def quantization(self) -> str | None:
        """A one-line summary of the models' quantization, or None when no model is quantized."""
        forms = [f"{role} {m.quantization.method}" for role, m in self.models()
                 if m.quantization is not None and m.quantization.method != "none"]
        return ", ".join(forms) or None

    def graphs(self) -> list[GraphEntry]:
        """Every graph of the pack: the models' (draft, target) and the head's."""
        return [m.graph for _, m in self.models()] + ([self.head.graph] if self.head is not None else [])

    def loaded_files(self) -> list[str]:
        """Every file the runtime opens: graphs, their external data, the tokenizer's files and engines."""
        graphs = [p for g in self.graphs() for p in (g.path, *g.data_files)]
        graphs += [g.tree.kv_compact.path for g in self.graphs() if g.tree is not None]
        graphs += [p for _, m in self.models() if m.batched is not None for p in (m.batched.graph.path,
                                                                                  *m.batched.graph.data_files)]
        return list(dict.fromkeys([*graphs, *TOKENIZER_FILES, *self.tokenizer_files, *(e.path for e in self.engines)]))

    def file_entry(self, relpath: str) -> FileEntry:
        for entry in self.files:
            if entry.path == relpath:
                return entry
        raise SpecpackError("file not listed in the manifest", expected="a listed file", found=relpath)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)

    def write(self, pack_dir: Path) -> None:
        (pack_dir / MANIFEST_FILE).write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def read(cls, pack_dir: Path, *, sha256: str | None = None) -> Manifest:
        """Parse and validate `pack_dir/manifest.json`; with `sha256`, refuse a manifest whose digest differs."""
        return parse_manifest(read_manifest_bytes(Path(pack_dir), sha256=sha256), Path(pack_dir) / MANIFEST_FILE)


def _check_graph_names(role: str, model: ModelEntry, vocab_size: int) -> None:
    """The names the runtime binds are in the graph; the q tensors are as wide as the vocabulary."""
    extra_in, extra_out = ROLE_IO["tree" if model.graph.tree is not None else role]
    inputs = {s.name: s for s in model.graph.inputs}
    outputs = {s.name: s for s in model.graph.outputs}
    fed = model.graph.runtime_inputs() | extra_in
    if model.tree_width:  # the draft's tree form (ModelEntry: checked there)
        fed = fed | set(TREE_HEAD_INPUTS)
    if role == "target" and model.graph.kv_cache == "static":  # a static head pack's features cache, if it has one
        fed = fed | ({names.PAST_TARGET_FEATURES} & set(inputs))
    missing = sorted(fed - set(inputs)) + sorted(extra_out - set(outputs))
    if missing:
        raise ValueError(f"the {role} graph lacks {missing}")
    unfed = sorted(set(inputs) - fed - set(names.kv_names(model.num_layers, "past")))
    if unfed:  # every input is one the runtime feeds: nothing is left unbound
        raise ValueError(f"the {role} graph takes inputs the runtime does not feed: {unfed[:5]}"
                         + (f" (positions is {model.graph.positions!r})" if names.POSITION_IDS in unfed else ""))
    for spec in (inputs.get(names.DRAFT_PROBS), outputs.get(names.PROBS)):
        if spec is not None and spec.shape and isinstance(spec.shape[-1], int) and spec.shape[-1] != vocab_size:
            raise ValueError(f"{role} graph's {spec.name} has shape {spec.shape}, while vocab_size is {vocab_size}")


def _check_head(head: HeadEntry, target: ModelEntry, vocab_size: int) -> None:
    """The target graph gives the features the head reads; the head's q is as wide as the vocabulary."""
    features = next((s for s in target.graph.outputs if s.name == names.TARGET_FEATURES), None)
    if features is None:
        raise ValueError(f"a head pack's target graph must output {names.TARGET_FEATURES!r} (the features the head reads)")
    if features.shape and isinstance(features.shape[-1], int) and features.shape[-1] != head.feature_dim:
        raise ValueError(f"the target's {names.TARGET_FEATURES} has shape {features.shape}, while the head reads "
                         f"feature_dim {head.feature_dim}")
    cache = any(s.name == names.PAST_TARGET_FEATURES for s in target.graph.inputs)
    if head.graph.kv_cache != target.graph.kv_cache or cache != (target.graph.kv_cache == "static"):
        raise ValueError(f"the head graph's KV form ({head.graph.kv_cache}) is not the target's "
                         f"({target.graph.kv_cache}, features cache {'in' if cache else 'absent'}): a static head reads "
                         f"the target's features cache {names.PAST_TARGET_FEATURES!r}")
    if bool(head.tree_width) != (target.graph.tree is not None):
        raise ValueError(f"a head pack's head has the tree form (tree_width {head.tree_width}) exactly when its target "
                         f"verifies trees (tree {'present' if target.graph.tree is not None else 'absent'})")
    probs = next(s for s in head.graph.outputs if s.name == names.PROBS)
    if probs.shape and isinstance(probs.shape[-1], int) and probs.shape[-1] != vocab_size:
        raise ValueError(f"the head graph's probs has shape {probs.shape}, while vocab_size is {vocab_size}")
    if head.subset_size > vocab_size:
        raise ValueError(f"the head's subset_size {head.subset_size} is larger than vocab_size {vocab_size}")


def _check_files(manifest: Manifest) -> None:
    """Every file the runtime opens is listed (so it is hashed before it is opened); no file is listed twice."""
    listed = [f.path for f in manifest.files]
    if len(listed) != len(set(listed)):
        raise ValueError("a file is listed twice in files")
    if MANIFEST_FILE in listed:
        raise ValueError(f"files lists {MANIFEST_FILE} itself")
    unlisted = sorted(set(manifest.loaded_files()) - set(listed))
    if unlisted:
        raise ValueError(f"files the runtime opens are not listed in files (so never checked): {unlisted[:5]}")
    graphs = {p for g in manifest.graphs() for p in (g.path, *g.data_files)}
    graphs |= {g.tree.kv_compact.path for g in manifest.graphs() if g.tree is not None}
    shared = sorted((graphs | set(TOKENIZER_FILES) | set(manifest.tokenizer_files)) & {e.path for e in manifest.engines})
    if shared:  # an engine is executable code of its own: never a graph's or the tokenizer's file
        raise ValueError(f"engines name files that are graphs or tokenizer files: {shared[:5]}")


def manifest_sha256(pack_dir: Path) -> str:
    """The sha256 of a pack's manifest.json: pin it to refuse any pack but the one deployed."""
    return hashlib.sha256(read_manifest_bytes(Path(pack_dir))).hexdigest()


def read_manifest_bytes(pack_dir: Path, *, sha256: str | None = None) -> bytes:
    """manifest.json's bytes: a regular file inside the pack, at most MANIFEST_BYTES_LIMIT, matching `sha256`."""
    if sha256 is not None:
        from specpack.validation import check_sha256

        sha256 = check_sha256(sha256, "manifest_sha256")
    if not pack_dir.is_dir():
        raise SpecpackError(f"no pack at {pack_dir}", expected="a pack directory written by spec-export",
                            found="no such directory" if not pack_dir.exists() else "a file")
    path = pack_dir / MANIFEST_FILE
    try:
        inside = path.resolve().is_relative_to(pack_dir.resolve())
        st = os.stat(path)
    except (OSError, RuntimeError):
        raise SpecpackError(f"{pack_dir} is not a pack", expected=f"{MANIFEST_FILE} in the directory",
                            found="no manifest", hint="export one with `spec-export --draft D --target T -o PACK`"
                            ) from None
    if not inside or not stat.S_ISREG(st.st_mode):
        raise SpecpackError(f"{path} is not a plain file of the pack", expected="a regular file inside the pack",
                            found="a link to a path outside the pack" if not inside else "not a regular file",
                            hint="re-export the pack")
    if st.st_size > MANIFEST_BYTES_LIMIT:
        raise SpecpackError(f"{path} is too large", expected=f"at most {MANIFEST_BYTES_LIMIT:,} bytes",
                            found=f"{st.st_size:,} bytes", hint="re-export the pack")
    with open(path, "rb") as f:
        data = f.read(MANIFEST_BYTES_LIMIT + 1)[:MANIFEST_BYTES_LIMIT]
    if sha256 is not None and (digest := hashlib.sha256(data).hexdigest()) != sha256:
        raise SpecpackError(f"{path} is not the manifest this pack was pinned to", expected=f"sha256 {sha256}",
                            found=f"sha256 {digest}",
                            hint="the pack was changed or replaced since it was deployed: deploy it again")
    return data


def parse_manifest(data: bytes, path: Path | str = MANIFEST_FILE) -> Manifest:
    """Validate manifest bytes against the schema; every problem is a SpecpackError naming the fields."""
    raw = parse_json(data, path)
    if not isinstance(raw, dict):
        raise _corrupted(path, f"a JSON {_json_type(raw)}")
    version = raw.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:
        newer = type(version) is int and version > SCHEMA_VERSION
        raise SpecpackError("unsupported pack schema", expected=f"schema_version {SCHEMA_VERSION}",
                            found=f"schema_version {_brief(version)}",
                            hint="upgrade specpack to read this pack" if newer else "re-export the pack with this version")
    try:
        return Manifest.model_validate(raw, strict=True)
    except ValidationError as err:
        raise schema_error(err, f"{path} does not match the pack schema") from None


def schema_error(err: ValidationError, what: str) -> SpecpackError:
    """A SpecpackError listing the first few fields that failed (never their values: they may be huge)."""
    problems = err.errors(include_url=False, include_input=False, include_context=False)
    shown = [f"{_location(p['loc'])}: {p['msg'][:200]}" for p in problems[:ERRORS_SHOWN]]
    more = f" (and {len(problems) - ERRORS_SHOWN} more)" if len(problems) > ERRORS_SHOWN else ""
    return SpecpackError(what, expected="a manifest written by spec-export (docs/manifest.schema.json)",
                         found="; ".join(shown) + more, hint="re-export the pack")


def parse_json(data: bytes, path: Path | str) -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no NaN/Infinity (nor numbers too large for a float: 1e999),
    bounded nesting and size."""
    try:
        text = data.decode("utf-8")
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                           parse_float=_finite_float)
    except UnicodeDecodeError as err:
        raise _corrupted(path, f"bytes that are not UTF-8 (at byte {err.start})") from None
    except RecursionError:
        raise _corrupted(path, "JSON nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, duplicate keys, NaN, ints of more than 4300 digits
        raise _corrupted(path, str(err).splitlines()[0][:200]) from None
    _check_shape(value, path)
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a JSON object repeats a key")
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    """A JSON number as a float; 1e999 (which Python reads as infinity) is refused like Infinity."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


def _check_shape(value: Any, path: Path | str) -> None:
    """Iteratively: nesting depth, node count, and every string valid Unicode (no lone surrogates)."""
    stack, nodes = [(value, 1)], 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if depth > JSON_DEPTH_LIMIT or nodes > JSON_NODES_LIMIT:
            raise _corrupted(path, f"JSON nested deeper than {JSON_DEPTH_LIMIT} levels" if depth > JSON_DEPTH_LIMIT
                             else f"more than {JSON_NODES_LIMIT:,} JSON values")
        if isinstance(node, dict):
            stack.extend((item, depth + 1) for pair in node.items() for item in pair)
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)
        elif isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                raise _corrupted(path, "a string with a lone surrogate (\\ud800-\\udfff)") from None


def _corrupted(path: Path | str, found: str) -> SpecpackError:
    return SpecpackError(f"corrupted manifest {path}", expected="a JSON object written by spec-export", found=found,
                         hint="re-export the pack")


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return _brief(out or "manifest", quote=False)


def _json_type(value: Any) -> str:
    return {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(value), "null")


def _brief(value: Any, *, quote: bool = True, limit: int = 60) -> str:
    """A short, printable rendering of a value from an untrusted file."""
    text = repr(value) if quote else str(value)
    text = text.encode("ascii", "backslashreplace").decode("ascii")
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
