"""The calibrated Q/DQ modes (modes.py: int8-sq, fp8): a plain graph and a calibration set in, a Q/DQ graph out.

    plain.onnx ─ activation ranges of each weight MatMul's input over the set (ONNX Runtime, CPU)
      int8-sq: ─ SmoothQuant (Xiao et al. 2023): s_j = max|X_j|^a / max|W_j|^(1-a), W' = diag(s) W, X' = X / s
                 (an explicit Mul before the MatMul: TensorRT fuses it into the activation's quantize)
      ─ nvidia-modelopt's ONNX PTQ (max calibration on the CPU EP): QuantizeLinear / DequantizeLinear of
        INT8 (int8-sq) or FLOAT8E4M3FN (fp8) on the weight MatMuls' activations and weights
      ─> plain.<mode>.onnx + one .data file, the form TensorRT consumes for explicit quantization

Quantized: every MatMul with a constant 2-D weight except the lm_head (kept in full precision, as
TensorRT-LLM's int8_sq / fp8 keep it by default). The attention's activation-activation MatMuls, the norms
and the embedding stay in full precision. Results are cached by the graph's, the set's and the settings' hash
($SPECPACK_CACHE/calibrated/<key>/, default ~/.cache/specpack). Export-time only (onnx, onnxruntime, nvidia-modelopt).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from specpack import names
from specpack.calibration.sets import CalibrationSet
from specpack.errors import SpecpackError
from specpack.graphs.prune_logits import LmHead, find_lm_head
from specpack.hashing import sha256_file
from specpack.quantize import modes
from specpack.quantize.sites import find_sites


@dataclass(frozen=True)
class CalibratedSpec:
    """How a calibrated mode quantizes (modes.py names the modes)."""

    method: str                    # "int8-sq" | "fp8"
    quantize_mode: str             # modelopt's: "int8" | "fp8"
    smoothquant_alpha: float | None = None  # None: no smoothing
    calibration_method: str = "max"


SPECS = {modes.INT8_SQ: CalibratedSpec(modes.INT8_SQ, "int8", smoothquant_alpha=0.5),
         modes.FP8: CalibratedSpec(modes.FP8, "fp8")}


def quantize_calibrated(plain: Path, out: Path, method: str, calib: CalibrationSet,
                        cache_root: Path | None = None, cache: bool = True) -> dict[str, Any]:
    """Write the `method` Q/DQ form of `plain` to `out` (+ one external-data file); returns its manifest record.
    Temporary copies go beside `out` (the graph's size, twice at the peak); `cache` False: no cache copy."""
    plain, out, spec = Path(plain), Path(out), SPECS[method]
    versions = library_versions()
    key = _cache_key(plain, calib, spec, versions)
    cached = (cache_root or _default_cache()).expanduser() / key
    if cache and (cached / "record.json").is_file():
        _log(f"{method}: cached calibration {key[:12]} ({cached})")
        return _restore(cached, out)
    start = time.perf_counter()
    model = onnx.load(str(plain), load_external_data=False)
    weights = weight_matmuls(model.graph)
    if not weights:
        raise SpecpackError(f"{plain}: nothing to quantize", expected="MatMuls with constant 2-D weights",
                            found="none besides the lm_head")
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".calib-") as tmp:
        work = Path(tmp)
        source, smoothed = work / "source.onnx", 0  # modelopt rewrites its input file: give it a copy
        if spec.smoothquant_alpha is not None:
            ranges = activation_ranges(plain, model, weights, calib, work)
            smoothed = len(ranges)
            smooth(plain, ranges, spec.smoothquant_alpha, source)
        else:
            onnx.save_model(onnx.load(str(plain)), str(source), save_as_external_data=True,
                            location=f"{source.name}.data")
        nodes = weight_matmuls(onnx.load(str(source), load_external_data=False).graph)
        _modelopt_quantize(source, out, spec, calib, nodes, work)
    record = _record(out, spec, calib, versions, len(weights), smoothed, time.perf_counter() - start)
    if cache:
        _store(cached, out, record)
    return record


def weight_matmuls(graph: onnx.GraphProto) -> list[str]:
    """Names of the MatMul nodes with a constant 2-D weight, lm_head excluded."""
    lm_head = find_lm_head(graph)
    skip = lm_head.index if isinstance(lm_head, LmHead) else None
    return [graph.node[s.node].name for s in find_sites(graph) if s.kind == "matmul" and s.node != skip]


def activation_ranges(plain: Path, model: onnx.ModelProto, nodes: list[str], calib: CalibrationSet,
                      work: Path) -> dict[str, np.ndarray]:
    """max |X_j| over the set of each listed MatMul's activation input X [.., K], per channel j: node -> [K]."""
    import onnxruntime as ort

    by_name = {n.name: n for n in model.graph.node}
    wanted: dict[str, list[str]] = {}  # activation -> the MatMuls that read it (q, k, v share one)
    for n in nodes:
        wanted.setdefault(by_name[n].input[0], []).append(n)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_tensor_value_info(x, TensorProto.FLOAT, None) for x in wanted)
    probe_path = plain.parent / f".{plain.stem}.probe.onnx"  # beside the plain graph: same external-data file
    onnx.save_model(probe, str(probe_path))
    try:
        session = ort.InferenceSession(str(probe_path), providers=["CPUExecutionProvider"])
        ranges: dict[str, np.ndarray] = {}
        for feeds in prefill_feeds(session, calib):
            for x, value in zip(wanted, session.run(list(wanted), feeds), strict=True):
                m = np.abs(value.astype(np.float32)).reshape(-1, value.shape[-1]).max(axis=0)  # [K]
                for node in wanted[x]:
                    ranges[node] = np.maximum(ranges.get(node, m), m)
    finally:
        probe_path.unlink(missing_ok=True)
    return ranges


def smooth(plain: Path, ranges: dict[str, np.ndarray], alpha: float, out: Path) -> None:
    """SmoothQuant: W' = diag(s) W and a Mul(X, 1/s) before each MatMul; the same function, flatter activations."""
    model = onnx.load(str(plain))  # with weights: each smoothed W is rewritten
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    added = []
    for node in graph.node:
        if node.name not in ranges:
            continue
        w_proto = inits[node.input[1]]
        w = numpy_helper.to_array(w_proto).astype(np.float32)  # [K, N]
        s = np.power(np.maximum(ranges[node.name], 1e-5), alpha) / np.power(np.maximum(np.abs(w).max(axis=1), 1e-5),
                                                                             1.0 - alpha)  # [K]
        s = np.clip(s, 1e-4, 1e4).astype(np.float32)
        if readers[w_proto.name] > 1:  # a weight shared with another node: give this node its own copy
            w_proto = graph.initializer.add()
            w_proto.name = node.input[1] = f"{node.name}/smoothed_weight"
        w_proto.CopyFrom(numpy_helper.from_array((w * s[:, None]).astype(np.float32), w_proto.name))
        inv = numpy_helper.from_array((1.0 / s).astype(np.float32), f"{node.name}/smooth_inv_scale")  # [K]
        graph.initializer.append(inv)
        x_smoothed = f"{node.name}/smoothed_input"
        added.append((node, helper.make_node("Mul", [node.input[0], inv.name], [x_smoothed],
                                             name=f"{node.name}/smooth")))
        node.input[0] = x_smoothed
    for node, mul in added:  # right before its MatMul: the order stays topological
        graph.node.insert(list(graph.node).index(node), mul)
    onnx.save_model(model, str(out), save_as_external_data=True, location=f"{out.name}.data")


def prefill_feeds(session: Any, calib: CalibrationSet) -> Iterator[dict[str, np.ndarray]]:
    """One prefill per sequence through a plain graph, its inputs by name: concat form, an empty past
    [1, H, 0, D]; static form (the mask's length is the buffers' length M), buffers of M = S rows, all written."""
    inputs = {i.name: i for i in session.get_inputs()}
    past = [i for i in inputs.values() if i.name.startswith("past_key_values.")]
    dtype = np.float16 if past and past[0].type == "tensor(float16)" else np.float32
    static = bool(past) and inputs[names.ATTENTION_MASK].shape[1] == past[0].shape[2]  # both M
    for seq in calib.sequences:
        ids = np.asarray([seq], np.int64)  # [1, S]
        rows = ids.shape[1] if static else 0
        feeds = {names.INPUT_IDS: ids, names.POSITION_IDS: np.arange(ids.shape[1], dtype=np.int64)[None],
                 names.ATTENTION_MASK: np.ones_like(ids)}
        feeds.update({p.name: np.zeros((1, p.shape[1], rows, p.shape[3]), dtype) for p in past})
        yield feeds


def library_versions() -> dict[str, str]:
    from importlib.metadata import version

    return {lib: version(lib) for lib in ("nvidia-modelopt", "onnxruntime", "onnx")}


def _modelopt_quantize(source: Path, out: Path, spec: CalibratedSpec, calib: CalibrationSet, nodes: list[str],
                       work: Path) -> None:
    import onnxruntime as ort

    quantize = _modelopt()
    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    reader = _Reader(list(prefill_feeds(session, calib)))
    del session
    # dq_only: weights stored quantized (INT8 / FP8 initializers -> DequantizeLinear), activations Q -> DQ;
    # modelopt writes `out` + `<out name>_data` at ir_version 10
    quantize(str(source), quantize_mode=spec.quantize_mode, calibration_data_reader=reader,
             calibration_method=spec.calibration_method, calibration_eps=["cpu"], op_types_to_quantize=["MatMul"],
             nodes_to_quantize=[f"^{_escape(n)}$" for n in nodes], high_precision_dtype="fp32", dq_only=True,
             disable_mha_qdq=True, use_external_data_format=True, output_path=str(out), log_level="WARNING")


def _modelopt() -> Any:
    """modelopt's ONNX quantize(); a `tensorrt` namespace without TensorRT (tensorrt-stubs) is not TensorRT."""
    try:
        import modelopt.onnx.trt_utils as trt_utils
        from modelopt.onnx.quantization import quantize
    except ImportError as err:
        raise SpecpackError("calibrated quantization needs nvidia-modelopt", expected="nvidia-modelopt installed",
                            found=str(err), hint="pip install 'specpack[quantize]'") from None
    if trt_utils.TRT_PYTHON_AVAILABLE and not hasattr(trt_utils.trt, "Logger"):
        trt_utils.TRT_PYTHON_AVAILABLE = False
    return quantize


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over a list of feeds."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.feeds, self._it = feeds, iter(feeds)

    def get_first(self) -> dict[str, np.ndarray]:
        return self.feeds[0]

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self.feeds)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._it = iter(self.feeds[start_index:end_index])


def _escape(name: str) -> str:
    import re

    return re.escape(name)


def _record(out: Path, spec: CalibratedSpec, calib: CalibrationSet, versions: dict[str, str], weights: int,
            smoothed: int, seconds: float) -> dict[str, Any]:
    model = onnx.load(str(out), load_external_data=False)
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    method = f"{spec.calibration_method}" + (f", smoothquant alpha {spec.smoothquant_alpha}"
                                             if spec.smoothquant_alpha is not None else "")
    return {"method": spec.method, "bits": 8, "summary": {"weight_matmuls": weights, "smoothed": smoothed,
                                                          "qdq_nodes": len(qdq)},
            "calibration": {"method": method, "samples": calib.samples, "dataset_sha256": calib.sha256,
                            "versions": versions, "source": calib.source},
            "seconds": round(seconds, 1), "settings": asdict(spec)}


def _cache_key(plain: Path, calib: CalibrationSet, spec: CalibratedSpec, versions: dict[str, str]) -> str:
    data = plain.with_name(f"{plain.name}.data")
    graph = [sha256_file(plain), sha256_file(data) if data.is_file() else None]
    blob = json.dumps({"graph": graph, "dataset": calib.sha256, "spec": asdict(spec), "versions": versions})
    return hashlib.sha256(blob.encode()).hexdigest()


def _store(cached: Path, out: Path, record: dict[str, Any]) -> None:
    partial = cached.with_name(f".{cached.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    onnx.save_model(onnx.load(str(out)), str(partial / "graph.onnx"), save_as_external_data=True,
                    location="graph.onnx.data")
    (partial / "record.json").write_text(json.dumps(record))
    shutil.rmtree(cached, ignore_errors=True)
    partial.rename(cached)


def _restore(cached: Path, out: Path) -> dict[str, Any]:
    model = onnx.load(str(cached / "graph.onnx"))
    onnx.save_model(model, str(out), save_as_external_data=True, location=f"{out.name}.data")
    record: dict[str, Any] = json.loads((cached / "record.json").read_text())
    return {**record, "cached": True}


def _default_cache() -> Path:
    from specpack.cache_root import cache_root

    return cache_root() / "calibrated"


def _log(message: str) -> None:
    print(f"[quantize] {message}", file=sys.stderr, flush=True)
