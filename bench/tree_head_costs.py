"""What a tree verify and a draft head step cost on a device, at a real model's shape (random weights: time depends on
the shapes, not on the values), through the graphs spec-export writes (docs/trees.md, docs/heads.md).

    python bench/tree_head_costs.py --work DIR --json OUT [--shape 1.5b] [--device cuda] [--reps 30] [--graphs builder]
        [--profile]

  1. a random Qwen2 model at --shape (fp16 on cuda, fp32 on cpu), saved once under --work
  2. its verify graphs: the chain form (spec-export's default head) and the tree form (--max-tree-nodes 64), static
     cache, GroupQueryAttention (--graphs builder: the model builder's graphs, export/builder_tree.py's tree form; no
     head then); a draft head (specpack/heads/model.py, one layer, the 32,768-token subset) exported
     as head_step.onnx
  3. medians of bare runs (every buffer on the device, bound once; the greedy form captured as a CUDA graph where the
     EP allows), after CONTEXT tokens of cache: the chain verify over k drafts (k + 1 rows), the tree verify over T
     nodes (T + 1 rows; four chains of depth T / 4), the head's catch-up run (C rows of target features) and its
     drafting run (one row of its own output)

Reported: v(k) and v(T) as ratios to the chain verify of one draft (the padded target step every greedy step takes),
and c = the head's drafting run over that step; --profile: the kernels per run of the chain verify of one draft and
the trees of 1 and 16 nodes (why the builder's tree verify grows with its nodes: docs/trees.md, What remains 2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

SHAPES = {  # Qwen2.5 shapes; "tiny" to try the script on a CPU
    "1.5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "intermediate_size": 8960, "vocab_size": 151936},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 128, "vocab_size": 1000},
}
CONTEXT, MAX_LEN, TREE_MAX, SUBSET = 256, 1024, 64, 32768
KS, TREE_SIZES, CATCH_UP = (0, 1, 2, 4, 8), (1, 2, 4, 8, 16, 32, 64), (1, 2, 5)
PROFILED_SIZES, PROFILE_RUNS = (1, 16), 20  # --profile: the chain verify of one draft and the trees of 1 and 16 nodes


def log(*args: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *args, flush=True)


def make_model(shape: str, out: Path, dtype: str, device: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                         **SHAPES[shape])
    if not (out / "config.json").exists():
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, "float16" if dtype == "fp16" else
                                                                                 "float32"))
        model.save_pretrained(out)
        del model
    return config


def export_verify(model_dir: Path, work: Path, dtype: str, tree: int, graphs: str = "torch") -> Path:
    from specpack.export.graph_form import GraphForm
    from specpack.export.torch_export import export_plain_graph
    from specpack.graphs.attach import build_tree_verify_graph, build_verify_graph

    label = f"{'tree' if tree else 'chain'}{'_builder' if graphs == 'builder' else ''}"
    out = work / f"verify_{label}.onnx"
    if out.exists():
        return out
    plain = work / f"plain_{label}.onnx"
    t0 = time.perf_counter()
    if graphs == "builder":
        from specpack.export.builder_export import build_plain_graph

        plain = build_plain_graph(model_dir, work / f"plain_{label}", dtype, "cuda" if dtype == "fp16" else "cpu",
                                  tree_nodes=tree)[0]
    else:
        export_plain_graph(model_dir, plain, dtype, GraphForm("static", "gqa"), (), tree)
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    if tree:
        build_tree_verify_graph(plain, out, vocab, tree)
    else:
        build_verify_graph(plain, out, vocab)
    log(f"exported {out.name} in {time.perf_counter() - t0:.0f} s")
    return out


def export_head(config: Any, work: Path, dtype: str) -> tuple[Path, Any]:
    import torch

    from specpack.export.head_export import _export
    from specpack.export.torch_export import _save
    from specpack.graphs.attach import LogitsNotPrunedWarning, build_draft_step_graph
    from specpack.heads.model import DraftHead, HeadConfig

    layers = config.num_hidden_layers
    cfg = HeadConfig(model_type="qwen2", target_hidden=config.hidden_size, taps=(2, layers // 2, layers - 3),
                     hidden=config.hidden_size, heads=config.num_attention_heads, kv_heads=config.num_key_value_heads,
                     head_dim=config.hidden_size // config.num_attention_heads, intermediate=config.intermediate_size,
                     rope_theta=1e6, rms_eps=1e-6, vocab_rows=config.vocab_size,
                     subset_size=min(SUBSET, config.vocab_size))
    out = work / "head_step.onnx"
    if not out.exists():
        torch.manual_seed(1)
        subset = torch.arange(cfg.subset_size)
        head = DraftHead(cfg, torch.randn(cfg.vocab_rows, cfg.hidden) * 0.02,
                         torch.randn(cfg.subset_size, cfg.hidden) * 0.02, subset)
        head = head.to(getattr(torch, "float16" if dtype == "fp16" else "float32")).eval()
        plain = work / "head_step.plain.onnx"
        _save(_export(head, SimpleNamespace(config=cfg), dtype), plain)
        with warnings.catch_warnings():  # the head's logits come from a Scatter (one row already): as head_export
            warnings.simplefilter("ignore", LogitsNotPrunedWarning)
            build_draft_step_graph(plain, out, cfg.vocab_rows)
        log("exported head_step.onnx")
    return out, cfg


class Timer:
    """One session over a graph (greedy form where it has an If), buffers on the device, bound by name."""

    def __init__(self, graph: Path, device: str, capture: bool) -> None:
        import onnxruntime as ort

        from specpack.graphs.greedy_form import greedy_form
        from specpack.runtime.ort_session import EXTERNAL_DATA_FOLDER

        self.ort, self.device = ort, device
        opts = ort.SessionOptions()
        opts.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(graph.parent))
        opts.log_severity_level = 3
        providers: list[Any] = ["CPUExecutionProvider"]
        if device == "cuda":
            providers.insert(0, ("CUDAExecutionProvider", {"enable_cuda_graph": "1" if capture else "0"}))
        try:
            model: Any = greedy_form(graph)
        except ValueError:
            model = str(graph)
        self.refused: str | None = None  # why ONNX Runtime refused to capture, if it did
        try:
            self.session = ort.InferenceSession(model, opts, providers=providers)
        except Exception as err:  # onnxruntime's own exception types: capture refused (nodes left on the CPU)
            if not capture:
                raise
            self.refused = str(err).splitlines()[0]
            providers[0] = ("CUDAExecutionProvider", {"enable_cuda_graph": "0"})
            self.session = ort.InferenceSession(model, opts, providers=providers)
            capture = False
        self.capture = capture and device == "cuda"
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.graph_id = 0
        self.keep: list[Any] = []
        self.profiles: list[dict[str, Any]] = []

    def array(self, host: np.ndarray) -> Any:
        from specpack.runtime.device_buffers import DeviceArray

        buffer = DeviceArray(host.shape, host.dtype, self.device)
        buffer.write(np.ascontiguousarray(host))
        self.keep.append(buffer)
        return buffer.view()

    def median_ms(self, inputs: dict[str, Any], outputs: dict[str, Any], reps: int, profile: bool = False) -> float:
        """The median of `reps` runs after 5 warm-up ones; profile: then PROFILE_RUNS more under PyTorch's profiler,
        their kernels per run in self.profiles (head_step_cost.kernel_summary)."""
        from specpack.runtime.device_buffers import bind

        binding = self.session.io_binding()
        bind(binding, self.device, {n: v for n, v in inputs.items() if n in self.inputs}, outputs)
        options = self.ort.RunOptions()
        self.graph_id += 1
        options.add_run_config_entry("gpu_graph_id", str(self.graph_id) if self.capture else "-1")
        times = []
        for i in range(reps + 5):
            t0 = time.perf_counter()
            self.session.run_with_iobinding(binding, options)
            if i >= 5:
                times.append(time.perf_counter() - t0)
        if profile:
            from head_step_cost import device_profiler, kernel_summary

            with device_profiler() as prof:
                t0 = time.perf_counter()
                for _ in range(PROFILE_RUNS):
                    self.session.run_with_iobinding(binding, options)
                wall = time.perf_counter() - t0
            self.profiles.append(kernel_summary(prof, PROFILE_RUNS, wall))
        return 1e3 * statistics.median(times)


def verify_costs(graph: Path, config: Any, dtype: str, device: str, capture: bool, tree: bool, reps: int,
                 profiles: dict[str, Any] | None = None) -> dict[str, float]:
    """Median ms per size; `profiles` (a dict to fill): the kernels of PROFILED_SIZES' runs, by size."""
    from specpack import names
    from specpack.runtime.device_buffers import DeviceStaticKVCache

    timer = Timer(graph, device, capture)
    head_dim = config.hidden_size // config.num_attention_heads
    np_dtype = np.float16 if dtype == "fp16" else np.float32
    out: dict[str, float] = {}
    for size in (TREE_SIZES if tree else KS):
        seq = size + 1
        cache = DeviceStaticKVCache(config.num_hidden_layers, config.num_key_value_heads, head_dim, MAX_LEN, np_dtype,
                                    device)
        timer.keep.append(cache)
        cache.length = CONTEXT
        rng = np.random.default_rng(size)
        inputs = {names.INPUT_IDS: timer.array(rng.integers(0, config.vocab_size - 1, (1, seq))),
                  names.POSITION_IDS: timer.array(np.arange(CONTEXT, CONTEXT + seq, dtype=np.int64)[None]),
                  names.UNIFORMS: timer.array(np.full((1, seq), 0.5, np.float32)),
                  names.TEMPERATURE: timer.array(np.zeros(1, np.float32)),
                  names.TOP_K: timer.array(np.zeros(1, np.int64)), names.TOP_P: timer.array(np.ones(1, np.float32)),
                  **cache.bind_inputs(seq)}
        outputs = {names.N_ACCEPTED: timer.array(np.zeros(1, np.int64)),
                   names.NEXT_TOKEN: timer.array(np.zeros(1, np.int64)), **cache.bind_outputs(seq)}
        if tree:  # four chains of depth size / 4 (a chain below 4 nodes)
            parents = np.array([i - 4 if i >= 4 else -1 for i in range(size)], np.int64)[None]
            inputs[names.PARENTS] = timer.array(parents)
            outputs[names.PATH] = timer.array(np.zeros((1, seq), np.int64))
        else:
            inputs[names.DRAFT_PROBS] = timer.array(np.zeros((1, size, config.vocab_size), np.float32))
        profile = profiles is not None and size in PROFILED_SIZES
        out[str(size)] = timer.median_ms(inputs, outputs, reps, profile)
        if profile and profiles is not None:
            profiles[str(size)] = timer.profiles[-1]
        log(f"{graph.name} {'T' if tree else 'k'} = {size}: {out[str(size)]:.3f} ms")
    if timer.refused:
        out["capture_refused"] = timer.refused  # type: ignore[assignment]
    return out


def head_costs(graph: Path, cfg: Any, dtype: str, device: str, capture: bool, reps: int) -> dict[str, float]:
    from specpack import names

    timer = Timer(graph, device, capture)
    np_dtype = np.float16 if dtype == "fp16" else np.float32
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    for label, c, w in [*((f"catch_up_{c}", c, 0) for c in CATCH_UP), ("draft", 0, 1)]:
        past = rng.standard_normal((1, cfg.kv_heads, CONTEXT, cfg.head_dim)).astype(np_dtype) * 0.1
        inputs = {names.INPUT_IDS: timer.array(np.ones((1, c), np.int64)),
                  names.FEATURES: timer.array(rng.standard_normal((1, c, cfg.feature_dim)).astype(np_dtype)),
                  names.DRAFT_IDS: timer.array(np.ones((1, w), np.int64)),
                  names.HIDDEN_IN: timer.array(rng.standard_normal((1, w, cfg.hidden)).astype(np_dtype)),
                  **{name: timer.array(past) for name in names.kv_names(1, "past")},
                  names.UNIFORM: timer.array(np.full(1, 0.5, np.float32)),
                  names.TEMPERATURE: timer.array(np.zeros(1, np.float32)),
                  names.TOP_K: timer.array(np.zeros(1, np.int64)), names.TOP_P: timer.array(np.ones(1, np.float32))}
        present = np.zeros((1, cfg.kv_heads, CONTEXT + c + w, cfg.head_dim), np_dtype)
        outputs = {names.TOKEN: timer.array(np.zeros(1, np.int64)),
                   names.PROBS: timer.array(np.zeros((1, cfg.vocab_rows), np.float32)),
                   names.HIDDEN_OUT: timer.array(np.zeros((1, 1, cfg.hidden), np_dtype)),
                   **{name: timer.array(present) for name in names.kv_names(1, "present")}}
        out[label] = timer.median_ms(inputs, outputs, reps)
        log(f"head_step {label}: {out[label]:.3f} ms")
    if timer.refused:
        out["capture_refused"] = timer.refused  # type: ignore[assignment]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--shape", default="1.5b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--export-only", action="store_true", help="write the graphs under --work and stop")
    parser.add_argument("--graphs", default="torch", choices=["torch", "builder"], help="who writes the target's graphs")
    parser.add_argument("--profile", action="store_true",
                        help="the kernels of PROFILED_SIZES' verify runs (CUDA graphs on) under PyTorch's profiler: "
                             "where a tree verify's step grows with its nodes")
    args = parser.parse_args()
    dtype = "fp16" if args.device == "cuda" else "fp32"
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir = args.work / f"model-{args.shape}"
    config = make_model(args.shape, model_dir, dtype, args.device)
    result: dict[str, Any] = {"shape": args.shape, "dtype": dtype, "device": args.device, "context": CONTEXT,
                              "reps": args.reps, "tree_shape": "four chains of depth T / 4 (a chain below 4 nodes)",
                              "graphs": args.graphs}
    chain, tree = (export_verify(model_dir, args.work, dtype, nodes, args.graphs) for nodes in (0, TREE_MAX))
    head, cfg = export_head(config, args.work, dtype) if args.graphs == "torch" else (None, None)
    if args.export_only:
        return
    for capture in ((False, True) if args.device == "cuda" else (False,)):
        key = "cuda_graphs" if capture else "no_cuda_graphs"
        profiled = args.profile and (capture or args.device == "cpu")  # on the CPU: a dry run (no CUDA kernels)
        profiles: dict[str, dict[str, Any]] | None = {"chain": {}, "tree": {}} if profiled else None
        entry = result[key] = {"chain_verify_ms": verify_costs(chain, config, dtype, args.device, capture, False,
                                                               args.reps, profiles and profiles["chain"]),
                               "tree_verify_ms": verify_costs(tree, config, dtype, args.device, capture, True,
                                                              args.reps, profiles and profiles["tree"])}
        if profiles is not None:
            entry["profiles"] = profiles
        if head is not None:
            entry["head_step_ms"] = head_costs(head, cfg, dtype, args.device, capture, args.reps)
        step = entry["chain_verify_ms"]["1"]  # the padded target step of greedy decoding
        entry["v_chain"] = {k: ms / step for k, ms in entry["chain_verify_ms"].items() if k != "capture_refused"}
        entry["v_tree"] = {t: ms / step for t, ms in entry["tree_verify_ms"].items() if t != "capture_refused"}
        if head is not None:
            entry["c_head"] = entry["head_step_ms"]["draft"] / step
        log(key, "c_head", round(entry.get("c_head", 0.0), 3), "v_tree",
            {t: round(v, 2) for t, v in entry["v_tree"].items()})
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
