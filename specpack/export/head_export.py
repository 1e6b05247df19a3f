"""A trained draft head -> head_step.onnx (names.py, "Head packs"): its step forward exported with torch.onnx (dynamo),
then the draft step's sampling head attached (graphs/attach.py), so q is written exactly as draft_step.onnx writes it.

    input_ids  [1, C] ─┐
    features   [1, C, F] ─┤  DraftHead.step: rows from target features (fc), then   ┌─> logits [1, 1, V] (internal;
    draft_ids  [1, W] ─┼─> rows from the head's own output; one decoder layer,  ─┤    -inf outside the subset)
    hidden_in  [1, W, H] ─┤  causal over the L cached rows + the new ones          ├─> hidden_out [1, 1, H]
    past_key_values.0.* ─┘                                                        └─> present.0.* [1, kvh, L+C+W, D]
                                          + attach: logits -> sampling transform -> token [1], probs [1, V]

C, W and L are dynamic and independent (0 is allowed at run time: W = 0 for the run that catches up, C = 0 for the
runs that draft from the head's own output). The head is exported in the pack's dtype; its sampling head computes in
fp32 like every other head.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from specpack import names
from specpack.dtypes import GRAPH_DTYPES
from specpack.errors import SpecpackError
from specpack.export.torch_export import OPSET, _save
from specpack.graphs.attach import LogitsNotPrunedWarning, build_draft_step_graph
from specpack.heads.head_file import HeadRecord, build_head, check_target, read_head

HEAD_INPUTS = (names.INPUT_IDS, names.FEATURES, names.DRAFT_IDS, names.HIDDEN_IN, *names.kv_names(1, "past"))
HEAD_OUTPUTS = (names.LOGITS, names.HIDDEN_OUT, *names.kv_names(1, "present"))


def check_head_for_target(head_dir: Path, target_dir: Path, target_src: str) -> dict[str, Any]:
    """The head's record, after checking it was trained for this target (its weights' hash); a SpecpackError otherwise."""
    import torch
    from transformers import AutoModelForCausalLM

    from specpack.heads.target_hash import target_weights_sha256

    record = read_head(head_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    check_target(record, target_weights_sha256(target), target_src)
    return record.data


def export_head_step(head_dir: Path, target_dir: Path, out_onnx: Path, dtype: str, vocab_size: int) -> None:
    """head_step.onnx (+ .data) for the head at `head_dir`, its frozen parts from the target at `target_dir`."""
    import torch
    from transformers import AutoModelForCausalLM

    record = read_head(head_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    head = build_head(record, target).to(getattr(torch, GRAPH_DTYPES[dtype].torch))
    del target
    plain = out_onnx.with_name(f"{out_onnx.stem}.plain.onnx")
    program = _export(head, record, dtype)
    _save(program, plain)
    with warnings.catch_warnings():  # the head's logits come from a Scatter, not a recognizable lm_head: they are
        warnings.simplefilter("ignore", LogitsNotPrunedWarning)  # one row already
        build_draft_step_graph(plain, out_onnx, vocab_size)
    plain.unlink()


class _StepForward:
    """forward(input_ids, features, draft_ids, hidden_in, past_key, past_value) = DraftHead.step."""

    @staticmethod
    def wrap(head: Any) -> Any:
        import torch

        class StepForward(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.head = head

            def forward(self, input_ids: torch.Tensor, features: torch.Tensor, draft_ids: torch.Tensor,
                        hidden_in: torch.Tensor, past_key: torch.Tensor, past_value: torch.Tensor
                        ) -> tuple[torch.Tensor, ...]:
                return self.head.step(input_ids, features, draft_ids, hidden_in, past_key, past_value)

        return StepForward().eval()


def _export(head: Any, record: HeadRecord, dtype: str) -> Any:
    import torch
    from torch.export import Dim

    c = record.config
    torch_dtype = getattr(torch, GRAPH_DTYPES[dtype].torch)
    rows, own, past = 3, 2, 5  # tracing sizes (never 0 or 1, so every dim stays symbolic)
    example = (torch.zeros(1, rows, dtype=torch.int64), torch.zeros(1, rows, c.feature_dim, dtype=torch_dtype),
               torch.zeros(1, own, dtype=torch.int64), torch.zeros(1, own, c.hidden, dtype=torch_dtype),
               torch.zeros(1, c.kv_heads, past, c.head_dim, dtype=torch_dtype),
               torch.zeros(1, c.kv_heads, past, c.head_dim, dtype=torch_dtype))
    C, W, L = Dim("catchup_rows"), Dim("own_rows"), Dim("past_sequence_length")
    shapes = ({1: C}, {1: C}, {1: W}, {1: W}, {2: L}, {2: L})
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")  # "torchvision is not installed"
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            return torch.onnx.export(_StepForward.wrap(head), example, input_names=list(HEAD_INPUTS),
                                     output_names=list(HEAD_OUTPUTS), dynamic_shapes=shapes, opset_version=OPSET,
                                     dynamo=True, optimize=True, verbose=False)
    except Exception as e:  # torch.export raises many types; say it was the head
        raise SpecpackError("torch.onnx.export failed for the draft head", expected="an exportable head",
                            found=f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
                            hint="report this as a bug") from e
    finally:
        registration.setLevel(level)


__all__ = ["HEAD_INPUTS", "HEAD_OUTPUTS", "check_head_for_target", "export_head_step"]
