"""Hugging Face causal LM -> plain ONNX forward graph with explicit KV cache I/O (torch.onnx.export, dynamo).

    input_ids       [B, S]  ─┐
    position_ids    [B, S]  ─┤                                     ┌─> logits            [B, S, V]
    attention_mask  [B, L+S]─┼─> PlainForward: DynamicCache(past)  ┤
    past_key_values.{i}.key ─┤      -> model(..., use_cache=True)  └─> present.{i}.key   [B, kv_heads, L+S, head_dim]
    past_key_values.{i}.value┘         (cache grows by concat)         present.{i}.value

B, S and L are dynamic (dim_params batch_size, sequence_length, past_sequence_length; the mask's second dim is
total_sequence_length); L = 0 is a prefill with an empty cache. Names come from specpack/names.py.

The static form (kv_cache="static", names.py "Static KV cache form") has the same names with other shapes:

    input_ids       [1, S]  ─┐
    position_ids    [1, S]  ─┤                                       ┌─> logits           [1, S, V]
    attention_mask  [1, M]  ─┼─> StaticForward: the model with an   ─┤
    past_key_values.{i}.key ─┤      attention that writes rows      └─> present.{i}.key  [1, kv_heads, M, head_dim]
    past_key_values.{i}.value┘      [L, L+S) of the past in place        present.{i}.value  (same buffers as past)

M = max_len is the buffers' length (dim_param max_sequence_length), the mask holds ones at [0, L + S): the
length is data, so every run over S tokens has the same shapes. static_attention.py has the two attention
forms (GroupQueryAttention, or default-domain ops for any head size).

The tree form (tree_nodes > 0: static cache, either attention; docs/trees.md) adds one input after the mask:

    parents         [1, T]  int64, the last T of the S rows are a token tree's nodes (parents[i] < i, -1: the
                            root, row S - T - 1); T = 0 .. tree_nodes (dim_param tree_nodes)
    -> each node attends to the rows before the nodes and to its own ancestors' rows only, at position
       position_ids[root] + depth (the nodes' own position_ids are not read); rows before the nodes are causal
    with taps (a head pack): the features cache after `parents`, every row's features written in place (the nodes'
    too, in node order: kv_compact moves the accepted path's rows, as for the KV cache)

The draft's tree form (draft_tree: a tree pack's draft model, static cache, either attention; docs/trees.md, "Trees
drafted by the draft model") adds two inputs after the mask, for the run's last W rows (its own rows: a token tree's
nodes being expanded), as a draft head's tree form does (export/head_export.py):

    draft_positions [1, W]     int64, each own row's position (replaces its position_ids; a node: the root's + depth)
    draft_mask      [1, W, M]  bool, the cache rows each own row may read, ANDed with the causal mask (a node: the
                               committed rows, its ancestors' rows and its own); W = 0: the static form, bit for bit
torch and transformers are imported inside functions only.
"""

from __future__ import annotations

import gc
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specpack import names
from specpack.dtypes import DTYPES, GRAPH_DTYPES
from specpack.errors import SpecpackError
from specpack.export.graph_form import CONCAT, GraphForm
from specpack.export.model_info import SUPPORTED_FAMILIES, ModelInfo, read_model_info
from specpack.limits import check_tree_nodes

if TYPE_CHECKING:
    import torch

OPSET = 20  # pinned: torch's default opset differs between versions
# dim_params of the exported graph (optimum's names; MAX: the static buffers' length, max_len)
BATCH, SEQ, PAST, TOTAL, MAX = ("batch_size", "sequence_length", "past_sequence_length", "total_sequence_length",
                                "max_sequence_length")
TREE = "tree_nodes"  # dim_param of `parents` in the tree form
OWN = "own_rows"  # dim_param of draft_positions / draft_mask in the draft's tree form


def export_plain_graph(model_dir: Path, out_onnx: Path, dtype: str = "fp32", form: GraphForm = CONCAT,
                       taps: tuple[int, ...] = (), tree_nodes: int = 0, draft_tree: bool = False) -> ModelInfo:
    """Export `model_dir` to `out_onnx` plus one external data file `{out_onnx.name}.data` next to it. `taps`: also
    output `target_features` [B, S, len(taps) * hidden], the inputs of those layers (transformers' hidden_states[i])
    concatenated: what a draft head reads (names.py, "Head packs"); in the static form a features cache instead,
    `past_target_features` -> `target_features` [1, 1, M, F] written in place at the run's rows, like the KV cache.
    tree_nodes > 0: the tree form (module docstring), for trees of up to tree_nodes nodes. draft_tree: the draft's tree
    form (module docstring: own rows' positions and mask), static cache only."""
    if dtype not in DTYPES:
        raise SpecpackError(f"unsupported export dtype {dtype!r}", expected=f"one of {', '.join(DTYPES)}",
                            found=repr(dtype), hint="fp32 for CPU; fp16 or bf16 for GPUs")
    model_dir, out_onnx = Path(model_dir), Path(out_onnx)
    info = read_model_info(model_dir)
    form.check(info.head_dim)
    check_tree_form(form, tree_nodes)
    if draft_tree and (form.kv_cache != "static" or tree_nodes or taps):
        raise SpecpackError("the draft's tree form is a static-cache graph without a tree verify or taps",
                            expected="kv_cache static, tree_nodes 0, no taps", found=f"{form}, tree_nodes {tree_nodes}, "
                            f"taps {taps}", hint="report this as a bug")
    out_onnx.parent.mkdir(parents=True, exist_ok=True)
    _log(f"exporting {out_onnx.stem} ({info.model_type}, {info.num_layers} layers, {dtype}, {form}) from "
         f"{model_dir} ...")
    start = time.perf_counter()

    if form.kv_cache == "static":
        from specpack.export import static_attention

        state = static_attention.StaticCacheState(form.attention)
        _register_static_attention(static_attention.make_attention(state))
        model = _load_model(model_dir, dtype, static_attention.ATTN_IMPLEMENTATION)
        program = _export(_static_forward(model, state, taps, tree_nodes, draft_tree),
                          _static_example_inputs(info, dtype, tree_nodes, _feature_dim(model, taps), draft_tree),
                          _static_dynamic_shapes(info, tree_nodes, bool(taps), draft_tree), info,
                          static_attention.TRANSLATIONS, taps, tree_nodes, draft_tree)
    else:
        model = _load_model(model_dir, dtype, "eager")
        program = _export(_plain_forward(model, taps), _example_inputs(info, dtype), _dynamic_shapes(info), info, None,
                          taps)
    del model
    _save(program, out_onnx)
    del program
    gc.collect()

    _check_graph(out_onnx, info, dtype, form, taps, tree_nodes, draft_tree)
    size = (out_onnx.stat().st_size + _data_path(out_onnx).stat().st_size) / 2**20
    _log(f"exported {out_onnx.stem} in {time.perf_counter() - start:.1f} s: {out_onnx} ({size:.0f} MiB)")
    return info


def check_tree_form(form: GraphForm, tree_nodes: int) -> None:
    """A SpecpackError unless tree_nodes is 0 (no tree) or 1..MAX_NODES with a form the tree verify graph has."""
    if not check_tree_nodes(tree_nodes):
        return
    if (form.kv_cache, form.heads) != ("static", "onnxruntime"):
        raise SpecpackError("the tree verify graph is built for the static KV cache with onnxruntime heads only",
                            expected="--kv-cache static --form onnxruntime",
                            found=f"--kv-cache {form.kv_cache} --form {form.heads}",
                            hint="pass --kv-cache static, or drop --max-tree-nodes (the concat cache and the "
                                 "TensorRT heads are not built yet)")


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _data_path(out_onnx: Path) -> Path:
    return out_onnx.with_name(f"{out_onnx.name}.data")


def _load_model(model_dir: Path, dtype: str, attn_implementation: str) -> torch.nn.Module:
    """The model in eval mode, `dtype` weights; eager attention for the concat form (smaller graph than sdpa's,
    same numbers), the static cache's own attention for the static form."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, GRAPH_DTYPES[dtype].torch),
                                                 attn_implementation=attn_implementation)
    _fusable_rms_norms(model)
    return model.eval()


# RMSNorms computed as transformers' Llama does: weight * (x * rsqrt(mean(x^2) + eps)), in fp32
_LLAMA_RMS_NORMS = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm"})


def _fusable_rms_norms(model: torch.nn.Module) -> None:
    """Compute each Llama-style RMSNorm as x / sqrt(mean(x^2) + eps): the same function, exported as the
    Pow-ReduceMean-Add-Sqrt-Div-Mul chain that ONNX Runtime fuses into one SimplifiedLayerNormalization node
    at load time (rsqrt exports as Sqrt-Reciprocal-Mul, which it does not fuse). The file keeps default ops."""
    import types

    import torch

    def forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        x = hidden_states.to(torch.float32)
        x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)

    for module in model.modules():
        if type(module).__name__ in _LLAMA_RMS_NORMS:
            module.forward = types.MethodType(forward, module)


def _register_static_attention(attention: Any) -> None:
    """Make `attention` transformers' attention function called ATTN_IMPLEMENTATION (no mask function: the
    static attention builds its own mask from the static attention mask)."""
    from transformers import AttentionInterface

    from specpack.export.static_attention import ATTN_IMPLEMENTATION

    AttentionInterface.register(ATTN_IMPLEMENTATION, attention)


def _plain_forward(model: torch.nn.Module, taps: tuple[int, ...] = ()) -> torch.nn.Module:
    """Wrap `model` as forward(input_ids, position_ids, attention_mask, *past) -> (logits, *present), with
    target_features after logits when there are `taps`."""
    import inspect

    import torch
    from transformers import DynamicCache

    # transformers 5.24 names the cache argument `cache`; earlier 5.x releases `past_key_values`
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    class PlainForward(torch.nn.Module):
        def __init__(self, lm: torch.nn.Module):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                    *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
            # past: key_0, value_0, key_1, ... each [B, kv_heads, L, head_dim]
            # Full-attention layers for every model (no config): present = past + new, even for sliding-window
            # models, whose window the attention mask still applies. Rollback stays "keep the first L entries".
            cache = DynamicCache(ddp_cache_data=list(zip(past[0::2], past[1::2], strict=True)))
            out = self.lm(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                          use_cache=True, output_hidden_states=bool(taps), **{cache_arg: cache})
            layers: list[Any] = list(cache.layers)  # updated in place by the model
            presents = [t for layer in layers for t in (layer.keys, layer.values)]
            return (out.logits, *_features(out, taps), *presents)  # [B, S, V], [B, S, F], [B, kv_heads, L+S, D] ...

    return PlainForward(model).eval()


def _features(out: Any, taps: tuple[int, ...]) -> list[torch.Tensor]:
    """[target_features [B, S, len(taps) * H]] (hidden_states[i] is the input of layer i), or [] without taps."""
    import torch

    return [torch.cat([out.hidden_states[i] for i in taps], dim=-1)] if taps else []


def _example_inputs(info: ModelInfo, dtype: str) -> tuple[Any, ...]:
    """Tracing inputs; sizes 2, 3, 5 (never 0 or 1) so torch.export keeps every dim symbolic."""
    import torch

    batch, seq, past = 2, 3, 5
    kv = (batch, info.kv_heads, past, info.head_dim)
    torch_dtype = getattr(torch, GRAPH_DTYPES[dtype].torch)
    return (
        torch.zeros(batch, seq, dtype=torch.int64),  # input_ids       [B, S]
        torch.arange(past, past + seq).repeat(batch, 1),  # position_ids    [B, S]
        torch.ones(batch, past + seq, dtype=torch.int64),  # attention_mask  [B, L+S]
        *[torch.zeros(kv, dtype=torch_dtype) for _ in range(2 * info.num_layers)],  # past  [B, H, L, D]
    )


def _dynamic_shapes(info: ModelInfo) -> tuple[Any, ...]:
    from torch.export import Dim

    batch, seq, past, total = Dim(BATCH), Dim(SEQ), Dim(PAST), Dim(TOTAL)
    return ({0: batch, 1: seq}, {0: batch, 1: seq}, {0: batch, 1: total},
            tuple([{0: batch, 2: past}] * (2 * info.num_layers)))


def _static_forward(model: torch.nn.Module, state: Any, taps: tuple[int, ...] = (), tree_nodes: int = 0,
                    draft_tree: bool = False) -> torch.nn.Module:
    """Wrap `model` as forward(input_ids, position_ids, attention_mask [1, M], *past [1, H, M, D]) ->
    (logits, *present): the attention registered for `state` writes each layer's new rows into its past.
    tree_nodes > 0: forward(input_ids, position_ids, attention_mask, parents [1, T], *past), the tree form.
    draft_tree: forward(input_ids, position_ids, attention_mask, draft_positions [1, W], draft_mask [1, W, M], *past),
    the draft's tree form."""
    import torch

    from specpack.export import static_attention as sa
    from specpack.graphs.tree_head import doubling_rounds

    class StaticTreeForward(torch.nn.Module):
        def __init__(self, lm: torch.nn.Module):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                    parents: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
            feature_cache, past = (rest[0], rest[1:]) if taps else (None, rest)  # [1, 1, M, F], [1, H, M, D] ...
            seq = input_ids.shape[1]
            anc = sa.tree_ancestors(parents[0], doubling_rounds(tree_nodes))  # [T, T]
            end = attention_mask.sum(dim=-1)  # [1] L + S (data: the start L is end - S, taken in tree_allowed)
            state.begin(attention_mask, past, sa.tree_allowed(anc, seq, end, attention_mask.shape[1]))
            out = self.lm(input_ids=input_ids, position_ids=sa.tree_positions(position_ids, anc), use_cache=False,
                          output_hidden_states=bool(taps))
            features = [] if feature_cache is None else [_write_features(feature_cache, out, taps, input_ids, end)]
            return (out.logits, *features, *state.ordered_presents())  # [1, S, V], [1, 1, M, F], [1, H, M, D]

    class StaticForward(torch.nn.Module):
        def __init__(self, lm: torch.nn.Module):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                    *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
            feature_cache, past = (rest[0], rest[1:]) if taps else (None, rest)  # [1, 1, M, F], [1, H, M, D] ...
            state.begin(attention_mask, past)
            # no cache object and no mask for transformers: the static attention reads both from `state`
            out = self.lm(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                          output_hidden_states=bool(taps))
            features = [] if feature_cache is None else [
                _write_features(feature_cache, out, taps, input_ids, attention_mask.sum(dim=-1))]
            return (out.logits, *features, *state.ordered_presents())  # [1, S, V], [1, 1, M, F], [1, H, M, D]

    class StaticDraftTreeForward(torch.nn.Module):
        def __init__(self, lm: torch.nn.Module):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                    draft_positions: torch.Tensor, draft_mask: torch.Tensor, *past: torch.Tensor
                    ) -> tuple[torch.Tensor, ...]:
            # the last W of the S rows are own rows: at draft_positions, reading what draft_mask allows (and the
            # causal mask); the rows before them are the static form's (positions = position_ids, causal)
            seq, own = input_ids.shape[1], draft_positions.shape[1]
            positions = torch.cat([position_ids[:, : seq - own], draft_positions], dim=1)  # [1, S]
            before = torch.ones(seq - own, draft_mask.shape[2], dtype=torch.bool, device=draft_mask.device)
            state.begin(attention_mask, past, torch.cat([before, draft_mask[0]]))  # allowed [S, M]
            out = self.lm(input_ids=input_ids, position_ids=positions, use_cache=False)
            return (out.logits, *state.ordered_presents())  # [1, S, V], [1, H, M, D] ...

    if draft_tree:
        return StaticDraftTreeForward(model).eval()
    return (StaticTreeForward(model) if tree_nodes else StaticForward(model)).eval()


def _write_features(cache: torch.Tensor, out: Any, taps: tuple[int, ...], input_ids: torch.Tensor,
                    end: torch.Tensor) -> torch.Tensor:
    """The features cache [1, 1, M, F] with the run's S rows written at [L, L + S) in place (L = end - S, end the
    static mask's ones): every row the run computed, a tree's nodes too (in node order, like the KV cache: kv_compact
    moves the accepted path's rows after a tree verify)."""
    import torch

    from specpack.export import static_attention as sa

    start = end - sa.shape_value(input_ids.shape[1], input_ids.device)  # [1] L (a shape value via a Range)
    return torch.ops.specpack.kv_write(cache, _features(out, taps)[0][:, None], start)


def _feature_dim(model: torch.nn.Module, taps: tuple[int, ...]) -> int:
    """F: the width of target_features (the tapped layers' inputs, concatenated); 0 without taps."""
    config: Any = model.config
    return len(taps) * int(config.get_text_config(decoder=True).hidden_size)


def _static_example_inputs(info: ModelInfo, dtype: str, tree_nodes: int = 0, feature_dim: int = 0,
                           draft_tree: bool = False) -> tuple[Any, ...]:
    """Tracing inputs for the static form: batch 1 (kept static), S = 3 new tokens after L = 2, M = 7; the tree
    form: S = 6 after L = 2, M = 11, the last T = 4 rows a tree (parents -1, 0, 0, 1); feature_dim > 0: the
    features cache [1, 1, M, feature_dim]; draft_tree: S = 6 after L = 2, M = 11, the last W = 4 own rows."""
    import torch

    seq, past, max_len = (6, 2, 11) if tree_nodes or draft_tree else (3, 2, 7)
    mask = torch.zeros(1, max_len, dtype=torch.int64)
    mask[:, : past + seq] = 1
    kv = (1, info.kv_heads, max_len, info.head_dim)
    tree = [torch.tensor([[-1, 0, 0, 1]])] if tree_nodes else []  # parents [1, T]
    if draft_tree:  # draft_positions [1, W], draft_mask [1, W, M]
        tree = [torch.tensor([[4, 5, 5, 6]]), torch.ones(1, 4, max_len, dtype=torch.bool)]
    torch_dtype = getattr(torch, GRAPH_DTYPES[dtype].torch)
    features = [torch.zeros(1, 1, max_len, feature_dim, dtype=torch_dtype)] if feature_dim else []
    return (
        torch.zeros(1, seq, dtype=torch.int64),  # input_ids       [1, S]
        torch.arange(past, past + seq)[None],  # position_ids    [1, S]
        mask,  # attention_mask  [1, M]
        *tree,
        *features,  # past_target_features [1, 1, M, F]
        *[torch.zeros(kv, dtype=torch_dtype) for _ in range(2 * info.num_layers)],
    )


def _static_dynamic_shapes(info: ModelInfo, tree_nodes: int = 0, features: bool = False, draft_tree: bool = False
                           ) -> tuple[Any, ...]:
    from torch.export import Dim

    seq, max_len = Dim(SEQ), Dim(MAX)
    tree: list[dict[int, Any]] = [{1: Dim(TREE)}] if tree_nodes else []
    if draft_tree:
        own = Dim(OWN)
        tree = [{1: own}, {1: own, 2: max_len}]
    cache = [{2: max_len}] if features else []  # the features cache leads forward's *rest, before the past
    return ({1: seq}, {1: seq}, {1: max_len}, *tree, tuple(cache + [{2: max_len}] * (2 * info.num_layers)))


def _export(forward: torch.nn.Module, example: tuple[Any, ...], dynamic_shapes: tuple[Any, ...], info: ModelInfo,
            translations: dict[Any, Any] | None, taps: tuple[int, ...] = (), tree_nodes: int = 0,
            draft_tree: bool = False) -> Any:
    """torch.onnx.export (dynamo) of a plain forward wrapper; returns the torch.onnx.ONNXProgram."""
    import torch

    tree = [names.PARENTS] if tree_nodes else [names.DRAFT_POSITIONS, names.DRAFT_MASK] if draft_tree else []
    cache = [names.PAST_TARGET_FEATURES] if taps and translations is not None else []  # static: the features cache
    input_names = [names.INPUT_IDS, names.POSITION_IDS, names.ATTENTION_MASK, *tree, *cache,
                   *names.kv_names(info.num_layers, "past")]
    output_names = [names.LOGITS, *([names.TARGET_FEATURES] if taps else []), *names.kv_names(info.num_layers, "present")]
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")  # "torchvision is not installed"
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.filterwarnings("ignore", message=r".*axis name.*will not be used")  # one per shared Dim
            warnings.filterwarnings("ignore", category=FutureWarning)  # torch-internal pytree deprecations
            return torch.onnx.export(
                forward, example, input_names=input_names, output_names=output_names, dynamic_shapes=dynamic_shapes,
                opset_version=OPSET, dynamo=True, optimize=True, verbose=False, custom_translation_table=translations)
    except Exception as e:  # torch.export and the ONNX translation raise many types; say which model failed
        raise SpecpackError(f"torch.onnx.export failed for this {info.model_type} model",
                            expected=f"a model torch.export can trace (tested: {', '.join(SUPPORTED_FAMILIES)})",
                            found=f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
                            hint="call export_plain_graph from Python to see the full traceback (chained as __cause__)") from e
    finally:
        registration.setLevel(level)


def _save(program: Any, out_onnx: Path) -> None:
    """Write out_onnx and its one external data file (location relative to the .onnx)."""
    import onnx_ir as ir

    data = _data_path(out_onnx)
    data.unlink(missing_ok=True)  # never append to a stale file
    # tensors under 1 KiB stay inline: ONNX Runtime's shape inference must read constant shapes and axes
    ir.save(program.model, out_onnx, external_data=data.name, size_threshold_bytes=1024)


def _check_graph(out_onnx: Path, info: ModelInfo, dtype: str, form: GraphForm, taps: tuple[int, ...] = (),
                 tree_nodes: int = 0, draft_tree: bool = False) -> None:
    """The saved graph's I/O names, types and fixed dims are the contract's; weights live in one data file."""
    import onnx

    onnx.checker.check_model(str(out_onnx))  # by path: fine for graphs over 2 GB
    model = onnx.load(str(out_onnx), load_external_data=False)
    static = form.kv_cache == "static"
    batch: str | int = 1 if static else BATCH
    kv_in = (GRAPH_DTYPES[dtype].onnx, (batch, info.kv_heads, MAX if static else PAST, info.head_dim))
    kv_out = (GRAPH_DTYPES[dtype].onnx, (batch, info.kv_heads, MAX if static else None, info.head_dim))  # None: L+S
    int64 = onnx.TensorProto.INT64
    want_in: dict[str, tuple[int, tuple[str | int | None, ...]]] = {
        names.INPUT_IDS: (int64, (batch, SEQ)), names.POSITION_IDS: (int64, (batch, SEQ)),
        names.ATTENTION_MASK: (int64, (batch, MAX if static else TOTAL)),
        **({names.PARENTS: (int64, (1, TREE))} if tree_nodes else {}),
        **({names.DRAFT_POSITIONS: (int64, (1, OWN)), names.DRAFT_MASK: (onnx.TensorProto.BOOL, (1, OWN, MAX))}
           if draft_tree else {}),
        **({names.PAST_TARGET_FEATURES: (GRAPH_DTYPES[dtype].onnx, (1, 1, MAX, None))} if taps and static else {}),
        **dict.fromkeys(names.kv_names(info.num_layers, "past"), kv_in)}
    want_out: dict[str, tuple[int, tuple[str | int | None, ...]]] = {
        names.LOGITS: (GRAPH_DTYPES[dtype].onnx, (batch, SEQ, info.vocab_rows)),
        **({names.TARGET_FEATURES: (GRAPH_DTYPES[dtype].onnx, (1, 1, MAX, None) if static else (batch, SEQ, None))}
           if taps else {}),
        **dict.fromkeys(names.kv_names(info.num_layers, "present"), kv_out)}
    for kind, values, want in (("input", model.graph.input, want_in), ("output", model.graph.output, want_out)):
        got = {v.name: (v.type.tensor_type.elem_type, tuple(d.dim_param or d.dim_value
                                                             for d in v.type.tensor_type.shape.dim)) for v in values}
        if list(got) != list(want):
            raise SpecpackError(f"exported graph {out_onnx} has unexpected {kind} names",
                                expected=", ".join(want), found=", ".join(got), hint="report this as a bug")
        for name, (elem, dims) in want.items():
            g_elem, g_dims = got[name]
            if g_elem != elem or len(g_dims) != len(dims) or any(w not in (None, g) for w, g in zip(dims, g_dims, strict=True)):
                raise SpecpackError(f"exported graph {out_onnx}: {kind} {name} has the wrong type or shape",
                                    expected=f"elem_type {elem}, dims {dims}",
                                    found=f"elem_type {g_elem}, dims {g_dims}", hint="report this as a bug")
    locations = {entry.value for init in model.graph.initializer for entry in init.external_data
                 if entry.key == "location"}
    if locations != {_data_path(out_onnx).name}:
        raise SpecpackError(f"exported graph {out_onnx} does not keep its weights in one external data file",
                            expected=_data_path(out_onnx).name, found=", ".join(sorted(locations)) or "(none)",
                            hint="report this as a bug")
