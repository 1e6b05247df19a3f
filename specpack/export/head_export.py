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

Two KV forms, the target's (`--kv-cache`):
    concat   past [1, kvh, L, D] -> present [1, kvh, L + C + W, D] (above)
    static   + attention_mask int64 [1, M] (ones at [0, L + C + W): the static mask); past / present [1, kvh, M, D], one
             buffer written in place at rows [L, L + C + W) (export/static_attention.py's ScatterND); `features` is the
             target's whole features cache [1, 1, M, F] (what the static verify writes in place), rows [L, L + C) read
             in the graph: every run over the same C, W binds the same buffers with the same shapes whatever L is, so
             the cuda backend captures it as a CUDA graph
    tree     (static, for a tree pack: --max-tree-nodes) + draft_positions int64 [1, W] and draft_mask bool [1, W, M]
             (an own row's position and the cache rows it may read, ANDed with the causal mask: a token tree's rows
             read the committed rows and their ancestors only); + tree_tokens int64 / tree_logprobs fp32 [1, W + 1, K]
             (TopK of the head's log-softmax over its subset, temperature 1, for the own rows then the last row) and
             tree_hidden [1, W + 1, H] (those rows' o). Chains bind positions = their cache rows and an all-true mask
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from specpack import names
from specpack.dtypes import GRAPH_DTYPES
from specpack.errors import SpecpackError
from specpack.export.torch_export import OPSET, _data_path, _save
from specpack.graphs.attach import LogitsNotPrunedWarning, build_draft_step_graph
from specpack.heads.head_file import HeadRecord, build_head, check_target, read_head
from specpack.limits import TREE_WIDTH_MAX  # K of the tree form's TopK: the most children a node of a drafted tree gets

HEAD_INPUTS = (names.INPUT_IDS, names.FEATURES, names.DRAFT_IDS, names.HIDDEN_IN, *names.kv_names(1, "past"))
HEAD_OUTPUTS = (names.LOGITS, names.HIDDEN_OUT, *names.kv_names(1, "present"))
STATIC_HEAD_INPUTS = (*HEAD_INPUTS[:4], names.ATTENTION_MASK, *HEAD_INPUTS[4:])
TREE_HEAD_INPUTS = (*HEAD_INPUTS[:4], names.DRAFT_POSITIONS, names.DRAFT_MASK, names.ATTENTION_MASK, *HEAD_INPUTS[4:])
TREE_HEAD_OUTPUTS = (*HEAD_OUTPUTS[:2], names.TREE_TOKENS, names.TREE_LOGPROBS, names.TREE_HIDDEN, *HEAD_OUTPUTS[2:])


def check_head_for_target(head_dir: Path, target_dir: Path, target_src: str) -> dict[str, Any]:
    """The head's record, after checking it was trained for this target (its weights' hash); a SpecpackError otherwise."""
    import torch
    from transformers import AutoModelForCausalLM

    from specpack.heads.target_hash import target_weights_sha256

    record = read_head(head_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    check_target(record, target_weights_sha256(target), target_src)
    return record.data


def cache_rows(features: Any, first: Any, count: int) -> Any:
    """Rows [first, first + count) of the features cache [1, 1, M, F] -> [C, F], gathering only those rows: indexing
    features[0, 0] first exports as two Gathers that copy the whole cache on every run (86 us of the 0.30 ms head
    step on an H100 at M 2560, F 4608: bench/README.md, "Run G")."""
    import torch

    picked = features.index_select(2, first + torch.arange(count))  # [1, 1, C, F]
    return picked.reshape(-1, features.shape[-1])  # [C, F] (a Reshape: no copy)


def tree_width(max_tree_nodes: int, subset_size: int) -> int:
    """K of a tree head step's TopK (0: no tree form): TREE_WIDTH_MAX, at most the nodes and the subset's tokens."""
    return min(TREE_WIDTH_MAX, max_tree_nodes, subset_size) if max_tree_nodes else 0


def export_head_step(head_dir: Path, target_dir: Path, out_onnx: Path, dtype: str, vocab_size: int,
                     kv_cache: str = "concat", max_tree_nodes: int = 0, attention: str = "standard",
                     max_len: int = 0, quantize: str = "none") -> dict[str, Any] | None:
    """head_step.onnx (+ .data) for the head at `head_dir`, its frozen parts from the target at `target_dir`;
    kv_cache "concat" or "static" (the target's form); max_tree_nodes > 0 (static only): the tree form (module
    docstring), its TopK K = tree_width(max_tree_nodes, subset size); attention (graph_form.head_attention's choice) "gqa": the
    static step through GroupQueryAttention, its rotary caches of max_len rows (the pack's). quantize "int8" / "int4":
    the step's weights weight-only quantized (quantize/stage.py, as a draft model's: MatMulNBits) before its sampling
    head is attached; returns that record (None: unquantized)."""
    import torch
    from transformers import AutoModelForCausalLM

    record = read_head(head_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    head = build_head(record, target).to(getattr(torch, GRAPH_DTYPES[dtype].torch))
    del target
    plain = out_onnx.with_name(f"{out_onnx.stem}.plain.onnx")
    width = tree_width(max_tree_nodes, record.config.subset_size)
    program = _export(head, record, dtype, kv_cache == "static", width, attention, max_len)
    _save(program, plain)
    graph, quantization = plain, None
    if quantize != "none":
        from specpack.quantize.stage import quantize_plain_graph

        graph = out_onnx.with_name(f"{out_onnx.stem}.{quantize}.onnx")
        quantization = quantize_plain_graph(plain, graph, quantize)
    with warnings.catch_warnings():  # the head's logits come from a Scatter, not a recognizable lm_head: they are
        warnings.simplefilter("ignore", LogitsNotPrunedWarning)  # one row already
        build_draft_step_graph(graph, out_onnx, vocab_size)
    for path in {plain, graph}:  # the intermediates (_attach moved the last one's data file into the pack)
        _data_path(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
    return quantization


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


class _StaticStepForward:
    """forward(input_ids, features, draft_ids, hidden_in, attention_mask, past_key, past_value): DraftHead.step over a
    static cache. Row r sits at position start + r, start = sum(attention_mask) - S; its key and value are written
    at cache row start + r and it attends to rows <= start + r. features [1, 1, M, F] is the target's features cache:
    the C feature rows are its rows [start, start + C).

    attention "standard": RoPE, the cache write and the masked softmax in default-domain ops
    (static_attention.standard_attention, GQA by reshape); "gqa": one GroupQueryAttention with the rotary inside
    (static_attention.group_query_attention_rotary; cos / sin caches of max_len rows), about 60 nodes fewer, what a
    GPU pays per node in a head step (docs/heads.md, "The head step's attention")."""

    @staticmethod
    def wrap(head: Any, attention: str = "standard", max_len: int = 0) -> Any:
        import torch

        from specpack.export.static_attention import rotary_caches, shape_value, standard_attention

        c = head.config
        scale = c.head_dim ** -0.5
        gqa = attention == "gqa"

        class StaticStepForward(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.head = head
                if gqa:  # [max_len, D / 2] each, in the head's dtype (initializers of the graph)
                    cos, sin = rotary_caches(head.inv_freq, max_len, head.fc.weight.dtype)
                    self.register_buffer("cos_cache", cos)
                    self.register_buffer("sin_cache", sin)

            def forward(self, input_ids: torch.Tensor, features: torch.Tensor, draft_ids: torch.Tensor,
                        hidden_in: torch.Tensor, attention_mask: torch.Tensor, past_key: torch.Tensor,
                        past_value: torch.Tensor) -> tuple[torch.Tensor, ...]:
                ids = torch.cat([input_ids, draft_ids], dim=1)  # [1, S]
                seq = ids.shape[1]
                total = attention_mask.sum(dim=-1)  # [1] L + S
                start = total - shape_value(seq, ids.device)  # [1] L (no host scalar mixed in)
                rows = cache_rows(features, start, input_ids.shape[1])  # [C, F]
                a = torch.cat([self.head.fc(rows[None]), hidden_in], dim=1)  # [1, S, H]
                if gqa:
                    q, k, v = self.head.project(a, ids)  # [1, S, heads * D], [1, S, kv_heads * D] x 2 (before RoPE)
                    out, present_key, present_value = torch.ops.specpack.group_query_attention_rotary(
                        q, k, v, past_key, past_value, (total - 1).to(torch.int32), self.cos_cache, self.sin_cache,
                        c.heads, c.kv_heads, scale)  # out [1, S, heads * D]
                else:
                    positions = start + torch.arange(seq)  # [S] a Range over the shape, then the data added
                    q, k, v = self.head._qkv(a, ids, positions)  # q [1, heads, S, D], k / v [1, kv_heads, S, D]
                    out, present_key, present_value = standard_attention(q, k, v, past_key, past_value, start, scale,
                                                                         None)
                o = self.head.finish(a, out.reshape(1, seq, c.heads * c.head_dim))  # [1, S, H]
                last = o[:, -1:]
                return self.head.full_logits(last), last, present_key, present_value

        return StaticStepForward().eval()


class _TreeStepForward:
    """forward(input_ids, features, draft_ids, hidden_in, draft_positions, draft_mask, attention_mask, past_key,
    past_value): the static step whose own rows sit at draft_positions and read only the cache rows draft_mask allows
    (their tree ancestors, the committed rows, themselves), plus each own row's top-K tokens, their log-probabilities
    and its output o. Catch-up rows are as in the static step (position = cache row, causal)."""

    @staticmethod
    def wrap(head: Any, width: int) -> Any:
        import torch

        from specpack.export.static_attention import shape_value, standard_attention

        c = head.config

        class TreeStepForward(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.head = head

            def forward(self, input_ids: torch.Tensor, features: torch.Tensor, draft_ids: torch.Tensor,
                        hidden_in: torch.Tensor, draft_positions: torch.Tensor, draft_mask: torch.Tensor,
                        attention_mask: torch.Tensor, past_key: torch.Tensor, past_value: torch.Tensor
                        ) -> tuple[torch.Tensor, ...]:
                ids = torch.cat([input_ids, draft_ids], dim=1)  # [1, S], S = C + W
                seq, catchup = ids.shape[1], input_ids.shape[1]
                start = attention_mask.sum(dim=-1) - shape_value(seq, ids.device)  # [1] L: the run's first cache row
                rows = cache_rows(features, start, catchup)  # [C, F]
                a = torch.cat([self.head.fc(rows[None]), hidden_in], dim=1)  # [1, S, H]
                positions = torch.cat([start + torch.arange(catchup), draft_positions[0]])  # [S]
                q, k, v = self.head._qkv(a, ids, positions)  # q [1, heads, S, D], k / v [1, kv_heads, S, D]
                allowed = torch.cat([torch.ones(catchup, draft_mask.shape[2], dtype=torch.bool), draft_mask[0]])
                out, present_key, present_value = standard_attention(q, k, v, past_key, past_value, start,
                                                                     c.head_dim ** -0.5, None, allowed)  # [S, M]
                o = self.head.finish(a, out.reshape(1, seq, c.heads * c.head_dim))  # [1, S, H]
                last = o[:, -1:]
                top_rows = torch.cat([o[:, catchup:], last], dim=1)  # [1, W + 1, H] own rows, then the last
                # one lm_head product for the own rows and the last: its weight then has one consumer, which the
                # exporter folds into an initializer the quantizer takes (two consumers kept a Transpose of the
                # [V_sub, H] rows in every run, in fp32: bench/README.md, "Run I's head in an int4 tree pack")
                sub = self.head.subset_logits(top_rows)  # [1, W + 1, V_sub]
                logp = torch.log_softmax(sub.to(torch.float32), dim=-1)  # [1, W + 1, V_sub]
                values, index = torch.topk(logp, width, dim=-1)  # [1, W + 1, K] best first (ties: the lower index)
                return (self.head.spread(sub[:, -1:]), last, self.head.subset[index], values, top_rows, present_key,
                        present_value)

        return TreeStepForward().eval()


def _export(head: Any, record: HeadRecord, dtype: str, static: bool = False, width: int = 0,
            attention: str = "standard", max_len: int = 0) -> Any:
    import torch
    from torch.export import Dim

    c = record.config
    torch_dtype = getattr(torch, GRAPH_DTYPES[dtype].torch)
    rows, own, past = 3, 2, 5  # tracing sizes (never 0 or 1, so every dim stays symbolic)
    example: tuple[torch.Tensor, ...] = (
        torch.zeros(1, rows, dtype=torch.int64), torch.zeros(1, rows, c.feature_dim, dtype=torch_dtype),
        torch.zeros(1, own, dtype=torch.int64), torch.zeros(1, own, c.hidden, dtype=torch_dtype),
        torch.zeros(1, c.kv_heads, past, c.head_dim, dtype=torch_dtype),
        torch.zeros(1, c.kv_heads, past, c.head_dim, dtype=torch_dtype))
    C, W, L = Dim("catchup_rows"), Dim("own_rows"), Dim("past_sequence_length")
    shapes: tuple[dict[int, Any], ...] = ({1: C}, {1: C}, {1: W}, {1: W}, {2: L}, {2: L})
    forward, input_names, translations = _StepForward.wrap(head), list(HEAD_INPUTS), None
    if static:  # the cache buffers' length M (L above) is the mask's too
        from specpack.export.static_attention import TRANSLATIONS

        m = rows + own + past  # M: the mask's ones fill it, so the run's rows start at `past`
        cache = torch.zeros(1, 1, m, c.feature_dim, dtype=torch_dtype)  # [1, 1, M, F]
        example = (example[0], cache, *example[2:4], torch.ones(1, m, dtype=torch.int64),
                   *(torch.zeros(1, c.kv_heads, m, c.head_dim, dtype=torch_dtype) for _ in range(2)))
        shapes = ({1: C}, {2: L}, {1: W}, {1: W}, {1: L}, {2: L}, {2: L})
        forward = _StaticStepForward.wrap(head, attention, max_len)
        input_names, translations = list(STATIC_HEAD_INPUTS), TRANSLATIONS
    output_names = list(HEAD_OUTPUTS)
    if static and width:  # the tree form: own rows' positions and mask [1, W], [1, W, M] before the static mask
        example = (*example[:4], torch.tensor([[past, past + 1]]), torch.ones(1, own, m, dtype=torch.bool),
                   *example[4:])
        shapes = (*shapes[:4], {1: W}, {1: W, 2: L}, *shapes[4:])
        forward, input_names, output_names = _TreeStepForward.wrap(head, width), list(TREE_HEAD_INPUTS), \
            list(TREE_HEAD_OUTPUTS)
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")  # "torchvision is not installed"
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            return torch.onnx.export(forward, example, input_names=input_names, output_names=output_names,
                                     dynamic_shapes=shapes, opset_version=OPSET, dynamo=True, optimize=True,
                                     verbose=False, custom_translation_table=translations)
    except Exception as e:  # torch.export raises many types; say it was the head
        raise SpecpackError("torch.onnx.export failed for the draft head", expected="an exportable head",
                            found=f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
                            hint="report this as a bug") from e
    finally:
        registration.setLevel(level)


__all__ = ["HEAD_INPUTS", "HEAD_OUTPUTS", "STATIC_HEAD_INPUTS", "TREE_HEAD_INPUTS", "TREE_HEAD_OUTPUTS",
           "TREE_WIDTH_MAX", "check_head_for_target", "export_head_step", "tree_width"]
