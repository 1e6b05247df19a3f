"""Plain graphs from onnxruntime-genai's model builder (`spec-export --graphs builder`): model dir -> plain .onnx.

    model dir --onnxruntime_genai.models.builder.create_model(-p PRECISION -e EP)--> work/ROLE-builder/model.onnx
      (GroupQueryAttention with the rotary inside, fused RMS norms, past/present one shared buffer)
      --rename to names.py's contract (from its genai_config.json)--> the static-cache plain graph (gqa form)

The builder's decoder is our static contract (docs/static_kv_cache.md) without position_ids: its
GroupQueryAttention takes the positions from the static mask (`seqlens_k = ReduceSum(attention_mask) - 1`,
`total_sequence_length = attention_mask.shape[1]` = max_len) and applies the rotary itself. The manifest
records that as `positions: "internal"`; the runtime then feeds no position_ids. With --max-tree-nodes the target's
graph is rewritten into the tree form (builder_tree.py: `parents` in, every GroupQueryAttention fed the tree's
position_ids and attention_bias, positions still internal).

What it builds, and what is refused before anything is built (`check_builder_config`, `check_builder_model`):

    --dtype  --ep    builder precision   io dtype
    fp32     cpu     fp32                fp32      (the builder's FP32 CPU)
    fp16     cuda    fp16                fp16      (the builder's FP16 CUDA; what bench/gpu.py measured)
    fp16     cpu     refused: the builder has no FP16 CPU build
    fp32     cuda    refused: the cuda backend refuses fp32 GroupQueryAttention (docs/cuda_backend.md)
    bf16     any     refused: no backend here runs bf16 packs

Weights: as the source has them (a .gguf source needs --dequantize), or weight-only int4 / int8 through the
builder's own quantizer (`--quantize-draft/--quantize-target int4|int8`: builder precision int4 / int8, ONNX
Runtime's MatMulNBits quantizer with quantize/modes.py's bits, block size, symmetry and algorithm, on
every MatMul and the lm_head; the token embedding stays at --dtype; on the CPU accuracy level 1, see
CPU_ACCURACY_LEVEL; a .gguf source is dequantized first). The calibrated Q/DQ modes and the GGUF's own blocks
are --graphs torch only. The KV cache is static, attention GroupQueryAttention (head_dim % 8 == 0), heads the
onnxruntime form. Families: those tested with our heads (BUILDER_ARCHITECTURES). Needs `pip install
specpack[builder]` (onnxruntime-genai, which keeps onnxruntime as it is). Runs in the export's worker process
(pipeline.py), so torch and the builder's memory go with it.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specpack import names
from specpack.errors import SpecpackError
from specpack.quantize import modes

if TYPE_CHECKING:
    import onnx

GRAPHS = ("torch", "builder")  # --graphs: who writes the plain graphs (torch.onnx.export, or the model builder)
EXECUTION_PROVIDERS = ("cpu", "cuda")  # --ep: what the builder's graphs are built for
BUILDER_PACKAGE = "onnxruntime-genai"
BUILDER_VERSION = "0.18.0"  # the version pinned by the `builder` extra (pyproject.toml)
BUILDER_PRECISIONS = {("fp32", "cpu"): "fp32", ("fp16", "cuda"): "fp16"}  # (--dtype, --ep) -> builder precision
BUILDER_QUANTIZATION = (modes.NONE, modes.INT4, modes.INT8)  # weight-only modes the builder's quantizer writes
QUANTIZED_OPS = ("MatMulNBits", "GatherBlockQuantized")  # what its int4 / int8 weights run as
# MatMulNBits accuracy level of the builder's quantized CPU graphs: 1 (fp32 activations), not modes.py's 4 (int8
# activations). The CPU GroupQueryAttention's output for a position differs in the last bits between a 1-row and a
# (k + 1)-row step; int8 activation rounding turns that into a jump of a quantization step, and greedy speculative
# output then differed from k = 0 (6 of 36 tiny-model runs; 0 of 36 at level 1, and 0 of 36 for --graphs torch's
# int4 at level 4, whose attention ops give the same bits). The fast int4 CPU pack is --graphs torch.
CPU_ACCURACY_LEVEL = 1
# Families whose builder graphs were checked against our contract and golden tests (tests/export/test_builder_export.py)
BUILDER_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
MODEL_FILE = "model.onnx"
GENAI_CONFIG = "genai_config.json"
INSTALL_HINT = "pip install specpack[builder] (onnxruntime-genai==0.18.0)"

# genai_config.json's decoder names -> ours (names.py); `%d` is the layer
_INPUT_KEYS = {"input_ids": names.INPUT_IDS, "attention_mask": names.ATTENTION_MASK,
               "position_ids": names.POSITION_IDS, "past_key_names": "past_key_values.%d.key",
               "past_value_names": "past_key_values.%d.value"}
_OUTPUT_KEYS = {"logits": names.LOGITS, "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}


def builder_version() -> str:
    """The installed model builder's version (onnxruntime-genai, or onnxruntime-genai-cuda on a GPU machine: the
    same module); a SpecpackError when it cannot be imported."""
    try:
        import onnxruntime_genai
        import onnxruntime_genai.models.builder  # its import pulls torch and transformers
    except ImportError as err:
        raise SpecpackError("--graphs builder needs onnxruntime-genai's model builder",
                            expected=f"{BUILDER_PACKAGE}=={BUILDER_VERSION} (or {BUILDER_PACKAGE}-cuda) importable",
                            found=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                            hint=INSTALL_HINT) from None
    return str(getattr(onnxruntime_genai, "__version__", "unknown"))


def check_builder_config(dtype: str, execution_provider: str) -> str:
    """The builder precision for `dtype` on `execution_provider`, or a SpecpackError for a combination the
    builder (or the backends) cannot do."""
    precision = BUILDER_PRECISIONS.get((dtype, execution_provider))
    if precision is None:
        builds = ", ".join(f"--dtype {d} --ep {e}" for d, e in BUILDER_PRECISIONS)
        why = {("fp16", "cpu"): "the model builder has no FP16 CPU build",
               ("fp32", "cuda"): "the cuda backend refuses fp32 GroupQueryAttention graphs (docs/cuda_backend.md)"
               }.get((dtype, execution_provider), "no backend here runs bf16 packs")
        raise SpecpackError(f"--graphs builder cannot build --dtype {dtype} for --ep {execution_provider}: {why}",
                            expected=builds, found=f"--dtype {dtype} --ep {execution_provider}",
                            hint="--dtype fp32 for CPU packs, --dtype fp16 --ep cuda for GPU packs")
    return precision


def check_builder_model(model_dir: Path, role: str) -> None:
    """A SpecpackError unless the model's architecture is one the builder path is tested with."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    archs = config.get("architectures") or []
    if not archs or archs[0] not in BUILDER_ARCHITECTURES:
        raise SpecpackError(f"--graphs builder does not support the {role}'s architecture",
                            expected=" / ".join(BUILDER_ARCHITECTURES),
                            found=f"{archs[0] if archs else 'no architectures'} (model_type "
                                  f"{config.get('model_type')!r}) in {model_dir}",
                            hint="export it with --graphs torch (the default)")


def check_builder_quantization(role: str, method: str) -> str:
    """`method` if the builder's quantizer can write it for `role`, else a SpecpackError saying what can."""
    if method in BUILDER_QUANTIZATION:
        return method
    if method == modes.GGUF:
        raise SpecpackError(f"--graphs builder cannot keep the {role}'s GGUF blocks", expected="weights the builder "
                            "reads: unquantized, or quantized by its own quantizer", found=f"{role}: {method}",
                            hint=f"pass --dequantize (fp weights) or --quantize-{role} int4|int8 (the builder "
                                 "quantizes the dequantized weights); --graphs torch keeps GGUF blocks")
    raise SpecpackError(f"--graphs builder does not write {method} graphs for the {role}",
                        expected=f"--quantize-{role} " + " | ".join(BUILDER_QUANTIZATION) + " (weight-only)",
                        found=f"--quantize-{role} {method}",
                        hint="calibrated Q/DQ graphs (int8-sq, fp8) are made from --graphs torch exports")


def builder_options(method: str, execution_provider: str) -> tuple[str | None, dict[str, str]]:
    """(precision override, the builder's extra options) for a weight-only `method`: modes.py's settings of that
    mode, so --graphs builder and --graphs torch quantize alike; (None, {}) for "none"."""
    if method == modes.NONE:
        return None, {}
    spec = modes.SPECS[method]
    options = {"block_size": str(spec.block_size), "is_symmetric": str(spec.symmetric).lower(),
               "algo_config": spec.algorithm, "op_types_to_quantize": "MatMul"}
    if execution_provider == "cpu":  # the CUDA kernels have no accuracy levels: the builder's default there
        options["accuracy_level"] = str(CPU_ACCURACY_LEVEL)
    if spec.lm_head_bits is not None and spec.lm_head_bits != spec.bits:
        options["matmul_mixed_precision"] = f"last_matmul:int{spec.lm_head_bits}"
    return method, options


def build_plain_graph(model_dir: Path, work: Path, dtype: str, execution_provider: str,
                      method: str = modes.NONE, taps: tuple[int, ...] = (),
                      tree_nodes: int = 0, draft_tree: bool = False) -> tuple[Path, dict[str, Any] | None]:
    """Run the model builder on `model_dir` into the folder `work` and rename its graph to our contract;
    returns the plain graph (work/model.onnx, weights in work/model.onnx.data) and, for a weight-only
    `method`, its quantization record for the manifest (None when not quantized). With `taps` (a head pack's
    target), the graph also writes the features the head reads into its features cache (builder_features.py);
    tree_nodes > 0: the tree form, for trees of up to tree_nodes nodes (builder_tree.py); draft_tree: a tree pack's
    draft in the draft's tree form (own rows' positions and mask: builder_tree.add_draft_tree_form)."""
    import time

    from onnxruntime_genai.models import builder

    precision = check_builder_config(dtype, execution_provider)
    quantized, extra = builder_options(method, execution_provider)
    precision = quantized or precision  # int4 / int8: io dtype fp32 on the CPU, fp16 on CUDA, as --dtype says
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    start = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # its progress is a log: spec-export's stdout is the pack path
        options = builder.parse_extra_options(None, str(model_dir), str(work), precision, execution_provider,
                                              str(cache), [f"{key}={value}" for key, value in extra.items()] or None)
        builder.create_model(None, str(model_dir), str(work), precision, execution_provider, str(cache), **options)
    plain = work / MODEL_FILE
    if not plain.is_file():
        raise SpecpackError(f"the model builder wrote no {MODEL_FILE}", expected=str(plain),
                            found=", ".join(sorted(p.name for p in work.iterdir())))
    genai_config = json.loads((work / GENAI_CONFIG).read_text(encoding="utf-8"))
    rename_to_contract(plain, genai_config)
    if taps:
        from specpack.export.builder_features import add_features_cache

        add_features_cache(plain, taps, int(genai_config["model"]["decoder"]["hidden_size"]))
    if tree_nodes:
        from specpack.export.builder_tree import add_tree_form

        add_tree_form(plain, tree_nodes, int(genai_config["model"]["context_length"]))
    if draft_tree:
        from specpack.export.builder_tree import add_draft_tree_form

        add_draft_tree_form(plain, int(genai_config["model"]["context_length"]))
    if quantized is None:
        return plain, None
    return plain, quantization_record(plain, method, extra, time.perf_counter() - start)


def quantization_record(plain: Path, method: str, extra: dict[str, str], seconds: float) -> dict[str, Any]:
    """The manifest's record of a builder-quantized graph, read from the graph itself: each MatMulNBits /
    GatherBlockQuantized weight with its bits and block size, weight bytes before (K x N at the io dtype)
    and after; a graph with no quantized weight is refused (the builder ignored the precision)."""
    import onnx
    from onnx import helper

    from specpack.quantize.external_data import stored_bytes

    model = onnx.load(str(plain), load_external_data=False)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    io_bytes = helper.tensor_dtype_to_np_dtype(graph.output[0].type.tensor_type.elem_type).itemsize
    tensors: list[dict[str, Any]] = []
    quantized: set[str] = set()
    dense_bytes = 0
    for node in graph.node:
        if node.op_type not in QUANTIZED_OPS:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = node.input[1] if node.op_type == "MatMulNBits" else node.input[0]
        bits, block = int(attrs.get("bits", 4)), int(attrs.get("block_size", 0))
        if node.op_type == "MatMulNBits":
            k, n = int(attrs["K"]), int(attrs["N"])
        else:  # GatherBlockQuantized: data [rows, cols * bits / 8] of packed values
            dims = list(inits[weight].dims)
            k, n = int(dims[0]), int(dims[1]) * 8 // bits
        dense_bytes += k * n * io_bytes
        quantized.update(i for i in node.input[1:] if i in inits)
        quantized.add(weight)
        tensors.append({"tensor": weight, "path": f"int{bits}", "op": node.op_type, "k": k, "n": n,
                        "bits": bits, "block_size": block})
    if not tensors:
        raise SpecpackError(f"{plain}: the model builder wrote no quantized weights for {method}",
                            expected=f"{' / '.join(QUANTIZED_OPS)} nodes", found="none",
                            hint="report it with the builder's version; export with --graphs torch meanwhile")
    after = sum(stored_bytes(t) for t in inits.values())
    before = after - sum(stored_bytes(inits[name]) for name in quantized) + dense_bytes
    spec = modes.SPECS[method]
    summary: dict[str, int] = {}
    for t in tensors:
        label = f"{t['op']} int{t['bits']}"
        summary[label] = summary.get(label, 0) + 1
    return {**spec.to_dict(), "method": method, "quantizer": f"onnxruntime-genai model builder {builder_version()}",
            "builder_options": extra, "accuracy_level": int(extra["accuracy_level"]) if "accuracy_level" in extra
            else None, "tensors": tensors, "summary": summary, "bytes_before": before, "bytes_after": after,
            "seconds": round(seconds, 1)}


def rename_to_contract(plain: Path, genai_config: dict[str, Any]) -> None:
    """Rename the graph's inputs and outputs from the names its genai_config.json gives them to names.py's,
    then check it is the static gqa contract: what else the graph takes or returns is refused."""
    import onnx

    decoder = genai_config["model"]["decoder"]
    layers = int(decoder["num_hidden_layers"])
    mapping: dict[str, str] = {}
    for section, keys in (("inputs", _INPUT_KEYS), ("outputs", _OUTPUT_KEYS)):
        for key, theirs in decoder.get(section, {}).items():
            ours = keys.get(key)
            if ours is None:
                continue  # checked below: an input or output we do not bind is refused
            pairs = [(theirs % i, ours % i) for i in range(layers)] if "%d" in ours else [(theirs, ours)]
            mapping.update({a: b for a, b in pairs if a != b})
    if not genai_config.get("search", {}).get("past_present_share_buffer", False):
        raise SpecpackError(f"{plain}: the builder's KV cache is not one shared buffer per tensor",
                            expected="past_present_share_buffer true in genai_config.json", found="false")
    model = onnx.load(str(plain), load_external_data=False)
    graph = model.graph
    if mapping:
        _rename(graph, mapping)
        onnx.save_model(model, str(plain))  # the weights stay in model.onnx.data, where its location points
    kv_in = set(names.kv_names(layers, "past"))
    allowed_in = {names.INPUT_IDS, names.ATTENTION_MASK, names.POSITION_IDS} | kv_in
    allowed_out = {names.LOGITS} | set(names.kv_names(layers, "present"))
    inputs, outputs = [i.name for i in graph.input], [o.name for o in graph.output]
    unknown = sorted(set(inputs) - allowed_in) + sorted(set(outputs) - allowed_out)
    missing = sorted((allowed_in - {names.POSITION_IDS}) - set(inputs)) + sorted(allowed_out - set(outputs))
    if unknown or missing or not any(n.op_type == "GroupQueryAttention" for n in graph.node):
        raise SpecpackError(f"{plain}: the builder's graph is not the static GroupQueryAttention contract",
                            expected="input_ids, attention_mask, past_key_values.* in; logits, present.* out; "
                                     "GroupQueryAttention nodes",
                            found=f"unknown {unknown[:4]}, missing {missing[:4]}",
                            hint="export this model with --graphs torch")


def _rename(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """Rename values everywhere they appear (graph inputs, outputs, node inputs and outputs)."""
    for value in [*graph.input, *graph.output]:
        value.name = mapping.get(value.name, value.name)
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
