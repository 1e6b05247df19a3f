"""What each stage of export_pack (pipeline.py) hands the next: one frozen record per stage, never changed after it
is returned (a later stage that adds to a record returns a new one). The pack writer (writer.py) takes them.

    Sources          the models as resolved: source, model directory, config, graph form, quantization mode;
                     the vocabulary, max_len and a draft head's record
    PlainGraphs      one plain graph per model (work/); a builder graph may already be quantized; with --max-batch
                     each model's batched form too
    QuantizedGraphs  the graph each model's head is attached to (the plain one, or its quantized form), with the
                     quantize stage's manifest record, fidelity measures added by that stage; the same for the
                     batched forms (their weights the batch-1 graph's: quantize/stage.py, quantize_graph_pair)
    AttachedGraphs   the pack's graphs (draft_step.onnx, verify.onnx, head_step.onnx, the batched graphs) and each
                     model's record

Records are keyed by role ("draft", "target"), draft first; an n-gram or head pack has no draft.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from specpack.contract.manifest import SourceRecord
from specpack.export.graph_form import GraphForm
from specpack.export.model_info import ModelInfo

Role = Literal["draft", "target"]
QuantizationRecord = Mapping[str, Any]  # the manifest's Quantization (contract/manifest.py), as the stage wrote it


@dataclass(frozen=True)
class Model:
    """One model of the pack, resolved: what was asked for and what it resolved to."""

    role: Role
    src: str                 # as given (--draft / --target)
    model_dir: Path          # the model directory it resolved to (a GGUF source: its converted copy)
    info: ModelInfo          # read from its config
    form: GraphForm          # its graph's KV cache, attention and head form
    method: str              # its quantization mode (quantize/modes.py)

    def record(self) -> SourceRecord:
        """The manifest's source record: what was asked for, where it resolved, file hashes."""
        from specpack.export.sources import source_record

        return SourceRecord.model_validate(source_record(self.src, self.model_dir))


@dataclass(frozen=True)
class Sources:
    """Stage 0: the models resolved and checked against each other."""

    models: tuple[Model, ...]              # (draft, target), or (target,) for a pack without a draft model
    vocab_size: int
    max_len: int
    head_dir: Path | None = None           # --draft-head
    head: Mapping[str, Any] | None = None  # its head.json record, checked against the target's weights

    def model(self, role: Role) -> Model | None:
        return next((m for m in self.models if m.role == role), None)

    @property
    def target(self) -> Model:
        return self.models[-1]

    @property
    def draft(self) -> Model | None:
        return self.model("draft")

    @property
    def taps(self) -> tuple[int, ...]:
        """The target layers whose features the head reads (none without a head)."""
        return () if self.head is None else tuple(self.head["config"]["taps"])


@dataclass(frozen=True)
class Graph:
    """One model's ONNX graph (weights in external data beside it) and how its weights are stored."""

    path: Path
    quantization: QuantizationRecord | None = None  # None: as exported


@dataclass(frozen=True)
class PlainGraphs:
    """Stage 1: each model's plain forward graph (export/ contract)."""

    graphs: Mapping[Role, Graph]
    batched: Mapping[Role, Graph] = field(default_factory=dict)  # --max-batch: the batched static form (work/)


@dataclass(frozen=True)
class QuantizedGraphs:
    """Stage 2 (and 3, which adds fidelity to the records): the graph each model's head goes on."""

    plain: PlainGraphs
    graphs: Mapping[Role, Graph]
    batched: Mapping[Role, Graph] = field(default_factory=dict)  # --max-batch: each batched form, quantized like `graphs`

    @property
    def quantized(self) -> dict[Role, QuantizationRecord]:
        return {role: g.quantization for role, g in self.graphs.items() if g.quantization is not None}


@dataclass(frozen=True)
class AttachedGraphs:
    """Stage 4: the pack's graphs, relative to the pack root, and each model's quantization record."""

    files: Mapping[Role, str]                                # draft_step.onnx, verify.onnx
    quantization: Mapping[Role, QuantizationRecord | None]
    head_file: str | None = None                             # head_step.onnx of a head pack
    head_quantization: QuantizationRecord | None = None      # --quantize-draft int8 / int4 of head_step.onnx
    batched: Mapping[Role, str] = field(default_factory=dict)  # --max-batch: verify_batched.onnx, draft_batched.onnx
    batched_quantization: Mapping[Role, QuantizationRecord] = field(default_factory=dict)  # quantized ones' records
