"""The head step's cost by attention form (docs/heads.md, "The head step's attention"): a trained head's head_step.onnx
exported in both static forms, `standard` (RoPE, cache write and masked softmax in default-domain ops) and `gqa` (one
GroupQueryAttention, rotary inside), each in its greedy form, run alone with the static cache of the pack's length,
one captured CUDA graph per run shape, the drawn token read back after every run (what the runtime pays per step).

    python bench/head_step_cost.py --head HEAD --target TARGET_DIR --json OUT.json [--max-len 2560] [--dtype fp16]
        [--context 256] [--reps 300] [--device cuda] [--profile]

Run shapes: a drafted row (C 0, W 1) and a catch-up of 3 rows after a verify (C 3, W 0), after `--context` cached rows;
each timed with and without the token's read-back, beside the floor: a one-Add graph run the same way (what ONNX
Runtime costs per run whatever the graph). For kernel times, run it under Nsight Compute on the device machine
(`ncu --clock-control none --print-summary per-kernel python bench/head_step_cost.py ... --reps 3`), or `--profile`:
each form's drafted-row run replayed PROFILE_RUNS times under PyTorch's profiler (CUPTI sees every kernel of the process,
ONNX Runtime's inside its CUDA graphs too): the kernels' time per run beside the run's wall time, and the kernels by
total time (where the step's 0.29 ms goes: its kernels, or the gaps between them).
Both forms get the same random inputs; their tokens are compared (fp16 kernels may differ in the last bits: reported,
not asserted). `--device cpu` is a dry run of the same code (no capture): the tests' tiny head.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

FORMS = ("standard", "gqa")
PROFILE_RUNS = 50
PROFILE_TOP = 25
SHAPES = {"draft (C 0, W 1)": (0, 1), "catch-up (C 3, W 0)": (3, 0)}
EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"


def export_forms(head: Path, target: Path, work: Path, dtype: str, max_len: int) -> dict[str, Path]:
    """head_step.onnx in each form (export/head_export.py), under work/FORM/."""
    from specpack.export.head_export import export_head_step
    from specpack.heads.head_file import read_head

    vocab = read_head(head).config.vocab_rows
    paths = {}
    for form in FORMS:
        out = work / form / "head_step.onnx"
        out.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        export_head_step(head, target, out, dtype, vocab, "static", 0, form, max_len)
        print(f"[head_step_cost] exported the {form} form in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        paths[form] = out
    return paths


def time_form(path: Path, device: str, max_len: int, context: int, reps: int, seed: int, profile: bool = False
              ) -> dict[str, Any]:
    """Median ms per run (token read back each run) of each run shape; the graph's node count and the tokens drawn;
    with `profile`, the drafted row's kernels (profile_runs)."""
    import onnx
    import onnxruntime as ort

    from specpack import names
    from specpack.graphs.greedy_form import greedy_form
    from specpack.runtime.device_buffers import DeviceArray, bind

    model = onnx.load(str(path), load_external_data=False)
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    elem = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    dtype = np.float16 if elem[names.HIDDEN_IN] == onnx.TensorProto.FLOAT16 else np.float32
    feature_dim, hidden = dims[names.FEATURES][3], dims[names.HIDDEN_IN][2]
    kv_heads, head_dim = dims[names.past_name(0, "key")][1], dims[names.past_name(0, "key")][3]
    vocab = next(o for o in model.graph.output if o.name == names.PROBS).type.tensor_type.shape.dim[1].dim_value
    opts = ort.SessionOptions()
    opts.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(path.parent))
    providers: list[Any] = ["CPUExecutionProvider"]
    if device == "cuda":
        providers.insert(0, ("CUDAExecutionProvider", {"enable_cuda_graph": "1"}))
    session = ort.InferenceSession(greedy_form(path), sess_options=opts, providers=providers)
    rng = np.random.default_rng(seed)
    features = DeviceArray((1, 1, max_len, feature_dim), dtype, device)  # [1, 1, M, F] the target's features cache
    features.write(rng.normal(0, 1, (1, 1, max_len, feature_dim)).astype(dtype))
    past = [DeviceArray((1, kv_heads, max_len, head_dim), dtype, device) for _ in range(2)]  # [1, kvh, M, D]
    for buffer in past:
        buffer.write(rng.normal(0, 1, buffer.shape).astype(dtype))
    sampling = {names.TEMPERATURE: (np.zeros(1, np.float32)), names.TOP_K: np.zeros(1, np.int64),
                names.TOP_P: np.ones(1, np.float32), names.UNIFORM: np.full(1, 0.5, np.float32)}
    out: dict[str, Any] = {"nodes": len(model.graph.node), "shapes": {}}
    for label, (c, w) in SHAPES.items():
        arrays = {names.INPUT_IDS: DeviceArray((1, c), np.int64, device), names.DRAFT_IDS: DeviceArray((1, w), np.int64, device),
                  names.HIDDEN_IN: DeviceArray((1, w, hidden), dtype, device),
                  names.ATTENTION_MASK: DeviceArray((1, max_len), np.int64, device),
                  **{name: DeviceArray(value.shape, value.dtype, device) for name, value in sampling.items()}}
        for name, value in sampling.items():
            arrays[name].write(value)
        if c:
            arrays[names.INPUT_IDS].write(rng.integers(0, vocab, (1, c)))
        if w:
            arrays[names.DRAFT_IDS].write(rng.integers(0, vocab, (1, w)))
            arrays[names.HIDDEN_IN].write(rng.normal(0, 1, (1, w, hidden)).astype(dtype))
        arrays[names.ATTENTION_MASK].write((np.arange(max_len) < context + c + w).astype(np.int64)[None])
        token, probs = DeviceArray((1,), np.int64, device), DeviceArray((1, vocab), np.float32, device)
        hidden_out = DeviceArray((1, 1, hidden), dtype, device)
        binding = session.io_binding()
        inputs = {name: array.view() for name, array in arrays.items()}
        inputs |= {names.FEATURES: features.view(), names.past_name(0, "key"): past[0].view(),
                   names.past_name(0, "value"): past[1].view()}
        outputs = {names.TOKEN: token.view(), names.PROBS: probs.view(), names.HIDDEN_OUT: hidden_out.view(),
                   names.present_name(0, "key"): past[0].view(), names.present_name(0, "value"): past[1].view()}
        bind(binding, device, inputs, outputs)
        timed = time_runs(session, binding, len(out["shapes"]), token, reps)
        out["shapes"][label] = {"median_ms": timed["run_and_read_median_ms"], "min_ms": timed["run_and_read_min_ms"],
                                "run_median_ms": timed["run_median_ms"], "token": int(token.read()[0])}
        if profile and w:  # the drafted row: what a chain pays per draft
            out["shapes"][label]["profile"] = profile_runs(session, binding, len(out["shapes"]) - 1, token)
    return out


def profile_runs(session: Any, binding: Any, graph_id: int, output: Any) -> dict[str, Any]:
    """PROFILE_RUNS replays of the captured run (its token read back each run) under PyTorch's profiler: the kernels'
    device time per run, the wall time per run, and the PROFILE_TOP kernels by total time (us per run, launches per
    run)."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", str(graph_id))
    with device_profiler() as prof:
        t0 = time.perf_counter()
        for _ in range(PROFILE_RUNS):
            session.run_with_iobinding(binding, options)
            output.read()
        wall = time.perf_counter() - t0
    return kernel_summary(prof, PROFILE_RUNS, wall)


def device_profiler() -> Any:
    """PyTorch's profiler over the CUDA activity (CUPTI: every kernel and copy of the process, ONNX Runtime's inside
    its CUDA graphs too); over the CPU where no GPU is (a dry run: no kernels)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU])


def kernel_summary(prof: Any, runs: int, wall_s: float) -> dict[str, Any]:
    """The profiled kernels and copies per run: device time, launches, the wall time, and the PROFILE_TOP by time."""
    from torch.autograd import DeviceType

    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type != DeviceType.CUDA:
            continue
        entry = kernels.setdefault(event.name, [0.0, 0.0])
        entry[0] += float(event.time_range.elapsed_us())  # a kernel's or a copy's own time on the device
        entry[1] += 1
    ranked = sorted(kernels.items(), key=lambda item: -item[1][0])
    return {"runs": runs, "wall_us_per_run": wall_s / runs * 1e6,
            "kernel_us_per_run": sum(us for us, _ in kernels.values()) / runs,
            "launches_per_run": sum(n for _, n in kernels.values()) / runs,
            "top": [{"name": name[:120], "us_per_run": us / runs, "launches_per_run": n / runs}
                    for name, (us, n) in ranked[:PROFILE_TOP]]}


def time_runs(session: Any, binding: Any, graph_id: int, output: Any, reps: int) -> dict[str, float]:
    """Warm up (the capture happens there), then `reps` runs: ms per run alone and with `output` read back after it
    (what the runtime pays per step: it reads the drawn token)."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", str(graph_id))
    for _ in range(5):
        session.run_with_iobinding(binding, options)
    runs, reads = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        session.run_with_iobinding(binding, options)
        t1 = time.perf_counter()
        output.read()
        runs.append(t1 - t0)
        reads.append(time.perf_counter() - t0)
    return {"run_median_ms": statistics.median(runs) * 1e3, "run_and_read_median_ms": statistics.median(reads) * 1e3,
            "run_and_read_min_ms": min(reads) * 1e3}


def time_floor(device: str, reps: int) -> dict[str, float]:
    """What ONNX Runtime costs per run whatever the graph: one Add over [1] fp32, bound and captured the same way,
    its output read back (the head step's fixed part: everything above it is the head's own kernels)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from specpack.runtime.device_buffers import DeviceArray, bind

    graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "floor",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every ONNX Runtime of this project reads (a newer onnx writes a newer IR by default)
    providers: list[Any] = ["CPUExecutionProvider"]
    if device == "cuda":
        providers.insert(0, ("CUDAExecutionProvider", {"enable_cuda_graph": "1"}))
    session = ort.InferenceSession(model.SerializeToString(), providers=providers)
    x, y = DeviceArray((1,), np.float32, device), DeviceArray((1,), np.float32, device)
    binding = session.io_binding()
    bind(binding, device, {"x": x.view()}, {"y": y.view()})
    timed = time_runs(session, binding, 0, y, reps)
    return {key: timed[key] for key in ("run_median_ms", "run_and_read_median_ms")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", required=True, type=Path)
    parser.add_argument("--target", required=True, type=Path, help="the target's model directory (the head's)")
    parser.add_argument("--json", required=True, type=Path)
    parser.add_argument("--max-len", type=int, default=2560)
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--profile", action="store_true", help="the drafted row's kernels under PyTorch's profiler")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        paths = export_forms(args.head, args.target, Path(work), args.dtype, args.max_len)
        result: dict[str, Any] = {"device": args.device, "dtype": args.dtype, "max_len": args.max_len,
                                  "context": args.context, "reps": args.reps, "forms": {}}
        for form, path in paths.items():
            result["forms"][form] = time_form(path, args.device, args.max_len, args.context, args.reps, seed=0,
                                              profile=args.profile)
        result["floor"] = time_floor(args.device, args.reps)
    standard, gqa = result["forms"]["standard"], result["forms"]["gqa"]
    result["ratio_gqa_over_standard"] = {label: gqa["shapes"][label]["median_ms"] / standard["shapes"][label]["median_ms"]
                                         for label in SHAPES}
    result["same_tokens"] = {label: gqa["shapes"][label]["token"] == standard["shapes"][label]["token"]
                             for label in SHAPES}
    args.json.write_text(json.dumps(result, indent=1))
    for form, entry in result["forms"].items():
        print(f"{form:9s} {entry['nodes']:4d} nodes  " + "  ".join(
            f"{label}: {s['median_ms']:.3f} ms" for label, s in entry["shapes"].items()))
    print(json.dumps({"ratio_gqa_over_standard": result["ratio_gqa_over_standard"],
                      "same_tokens": result["same_tokens"], "floor": result["floor"]}))


if __name__ == "__main__":
    main()
