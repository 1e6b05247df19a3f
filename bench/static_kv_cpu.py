"""Concat vs static KV cache on the CPU: step times of the plain graphs at the real models' shapes.

    python bench/static_kv_cpu.py --model draft=DIR --model target=DIR --work WORKDIR [--json OUT]

For each model and each graph form, export the plain graph once (each in its own process, cached in WORKDIR),
then time one forward over S new tokens (S = 1: an autoregressive or draft step; S = 5: a verify at k = 4)
after C tokens of context, on ONNX Runtime's CPU EP with the runtime's session options:

    concat           torch export, present = past + new, past [1, H, C, D] bound, present into a second buffer
    static-standard  torch export, static cache [1, H, max_len, D] written in place (ScatterND), default ops
    static-gqa       torch export, static cache, com.microsoft.GroupQueryAttention (shared past/present)
    genai-gqa        onnxruntime-genai's model builder (-p fp32 -e cpu): GroupQueryAttention with its rotary,
                     packed QKV and fused layer norms; the same static cache (its graph takes no position_ids)

Each timing: fill the cache with C random tokens, then `--reps` runs over the same S tokens at position C (the
static cache rolls back to C after each run: a length update), median in ms. Rounds alternate the forms of one
model (one session at a time: the 1.5B takes 6 GB in fp32), each round in a new session, so drift on a shared
machine hits every form. On the shared 2-core machine a round runs up to ~2x slower when another process takes
one of the two cores (tests do not take the lock), so each model entry has: `ms` (wall, median over rounds),
`ms_best` (the quietest round), `cpu_ms` (process CPU time, median over rounds: the work a form does, the
least disturbed by other processes), the ratios of each to the concat form, every round's values, and the
1-minute load average when each session started.
Times depend on the shapes only, not on the weight values; the logits of each form are also compared with the
concat form's at the last position (max |diff|), as a check that the forms compute the same function.
Run it under the shared lock: `flock /tmp/specpack-heavy.lock python bench/static_kv_cpu.py ...`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from specpack import names
from specpack.bench.report import cpu_model

FORMS = ("concat", "static-standard", "static-gqa", "genai-gqa")


def export_form(model_dir: Path, form: str, out_dir: Path) -> Path:
    """The plain graph of `model_dir` in `form`, exported in a child process unless already in `out_dir`."""
    onnx_path = out_dir / ("model.onnx" if form == "genai-gqa" else "plain.onnx")
    if onnx_path.exists():
        return onnx_path
    out_dir.mkdir(parents=True, exist_ok=True)
    if form == "genai-gqa":
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", str(model_dir), "-o", str(out_dir),
               "-p", "fp32", "-e", "cpu", "-c", str(out_dir / "cache")]
    else:
        kv_cache, _, attention = form.partition("-")
        code = ("import sys; from pathlib import Path; from specpack.export.torch_export import export_plain_graph; "
                "from specpack.export.graph_form import GraphForm; "
                f"export_plain_graph(Path(sys.argv[1]), Path(sys.argv[2]), 'fp32', GraphForm({kv_cache!r}, "
                f"{attention or 'standard'!r}))")
        cmd = [sys.executable, "-c", code, str(model_dir), str(onnx_path)]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    print(f"  exported {form} in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return onnx_path


class Graph:
    """One plain graph in a session, run through IOBinding on host buffers allocated once."""

    def __init__(self, onnx_path: Path, form: str, shape: dict[str, int], max_len: int) -> None:
        import onnxruntime as ort

        from specpack.runtime.ort_session import session_options
        from specpack.runtime.static_kv_cache import StaticKVCache

        self.form, self.shape = form, shape
        self.session = ort.InferenceSession(str(onnx_path), sess_options=session_options(None),
                                            providers=["CPUExecutionProvider"])
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.binding = self.session.io_binding()
        self.layers = shape["layers"]
        if form == "concat":  # [ping-pong, tensor, 1, H, max_len * D]: any [1, H, L, D] is a contiguous prefix
            self.kv = np.zeros((2, 2 * self.layers, shape["kv_heads"] * max_len * shape["head_dim"]), np.float32)
            self.mask = np.ones((1, max_len), np.int64)
            self.length = 0
        else:
            self.cache = StaticKVCache(self.layers, shape["kv_heads"], shape["head_dim"], max_len, np.float32)

    def _view(self, half: int, tensor: int, length: int) -> np.ndarray:
        flat = self.kv[half, tensor, : self.shape["kv_heads"] * length * self.shape["head_dim"]]
        return flat.reshape(1, self.shape["kv_heads"], length, self.shape["head_dim"])

    def run(self, ids: np.ndarray, keep: bool) -> np.ndarray:
        """Forward over ids [1, S] after the cached positions; keep: the new positions stay cached. -> logits."""
        seq = ids.shape[1]
        if self.form == "concat":
            start = self.length
            inputs = {names.ATTENTION_MASK: self.mask[:, : start + seq],
                      **{n: self._view(0, t, start) for t, n in enumerate(names.kv_names(self.layers, "past"))}}
            outputs = {n: self._view(1, t, start + seq) for t, n in enumerate(names.kv_names(self.layers, "present"))}
        else:
            start = self.cache.length
            inputs, outputs = dict(self.cache.bind_inputs(seq)), self.cache.bind_outputs(seq)
        inputs[names.INPUT_IDS] = ids
        if names.POSITION_IDS in self.input_names:
            inputs[names.POSITION_IDS] = np.arange(start, start + seq, dtype=np.int64)[None]
        for name, array in inputs.items():
            self.binding.bind_input(name, "cpu", 0, array.dtype.type, array.shape, array.ctypes.data)
        self.binding.bind_output(names.LOGITS, "cpu")  # first: get_outputs() keeps the order of the first binding
        for name, array in outputs.items():
            self.binding.bind_output(name, "cpu", 0, array.dtype.type, array.shape, array.ctypes.data)
        self.session.run_with_iobinding(self.binding)
        logits = self.binding.get_outputs()[0].numpy()
        if keep and self.form == "concat":  # the new cache is the other half: copy it back (setup only)
            for t in range(2 * self.layers):
                self._view(0, t, start + seq)[...] = self._view(1, t, start + seq)
            self.length = start + seq
        elif not keep and self.form != "concat":
            self.cache.advance(seq)
            self.cache.rollback(start)
        elif keep:
            self.cache.advance(seq)
        return logits


def time_graph(graph: Graph, context: int, seq: int, reps: int, rng: np.random.Generator, vocab: int
               ) -> tuple[float, float, np.ndarray]:
    """Median wall ms and median process CPU ms of `reps` runs over `seq` tokens after `context` cached ones,
    and the last logits row."""
    if graph.form == "concat":
        graph.length = 0
    else:
        graph.cache.reset()
    graph.run(rng.integers(0, vocab, (1, context)), keep=True)
    ids = rng.integers(0, vocab, (1, seq))
    wall, cpu = [], []
    for _ in range(reps):
        start, start_cpu = time.perf_counter(), time.process_time()
        logits = graph.run(ids, keep=False)
        wall.append((time.perf_counter() - start) * 1e3)
        cpu.append((time.process_time() - start_cpu) * 1e3)
    return statistics.median(wall), statistics.median(cpu), logits[0, -1]


def model_shape(model_dir: Path) -> dict[str, int]:
    config = json.loads((model_dir / "config.json").read_text())
    heads = config["num_attention_heads"]
    return {"layers": config["num_hidden_layers"], "heads": heads, "kv_heads": config.get("num_key_value_heads", heads),
            "head_dim": config.get("head_dim") or config["hidden_size"] // heads, "hidden": config["hidden_size"],
            "vocab": config["vocab_size"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, help="ROLE=MODEL_DIR (repeat)")
    parser.add_argument("--work", type=Path, required=True, help="where the exported graphs are kept")
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--contexts", default="64,512")
    parser.add_argument("--seqs", default="1,5", help="new tokens per run: 1 = a step, 5 = a verify at k = 4")
    parser.add_argument("--max-len", type=int, default=2048, help="static buffers' length (the pack default)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    forms = args.forms.split(",")
    contexts, seqs = [int(c) for c in args.contexts.split(",")], [int(s) for s in args.seqs.split(",")]

    results: dict[str, Any] = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "shared": True},
        "onnxruntime": __import__("onnxruntime").__version__, "dtype": "fp32", "max_len": args.max_len,
        "reps": args.reps, "rounds": args.rounds, "models": {}}
    for item in args.model:
        role, _, path = item.partition("=")
        model_dir = Path(path).expanduser()
        shape = model_shape(model_dir)
        print(f"{role}: {model_dir.name} {shape}", file=sys.stderr, flush=True)
        graphs = {form: export_form(model_dir, form, args.work / role / form) for form in forms}
        times: dict[str, dict[str, list[float]]] = {f: {} for f in forms}  # form -> case -> per-round medians
        cpu_times: dict[str, dict[str, list[float]]] = {f: {} for f in forms}
        loads: list[float] = []
        last: dict[str, np.ndarray] = {}
        for round_ in range(args.rounds):
            for form in forms if round_ % 2 == 0 else reversed(forms):
                graph = Graph(graphs[form], form, shape, args.max_len)
                loads.append(os.getloadavg()[0])
                for context in contexts:
                    for seq in seqs:
                        ms, cpu_ms, logits = time_graph(graph, context, seq, args.reps, np.random.default_rng(context),
                                                        shape["vocab"])
                        times[form].setdefault(f"context {context}, S {seq}", []).append(ms)
                        cpu_times[form].setdefault(f"context {context}, S {seq}", []).append(cpu_ms)
                        last[form] = logits
                        print(f"  round {round_} {form:16s} context {context:4d} S {seq}: {ms:7.1f} ms, "
                              f"CPU {cpu_ms:7.1f} ms, load {loads[-1]:.1f}", file=sys.stderr, flush=True)
                del graph
                gc.collect()
        entry: dict[str, Any] = {"dir": model_dir.name, **shape, "load_average_1min": [round(x, 2) for x in loads]}
        summaries: dict[str, tuple[dict[str, dict[str, list[float]]], Callable[[list[float]], float]]] = {
            "ms": (times, statistics.median), "ms_best": (times, min), "cpu_ms": (cpu_times, statistics.median)}
        for key, (table, reduce) in summaries.items():
            entry[key] = {form: {case: round(reduce(v), 2) for case, v in table[form].items()} for form in forms}
        entry["ms_rounds"] = {form: {case: [round(x, 1) for x in v] for case, v in times[form].items()} for form in forms}
        entry["cpu_ms_rounds"] = {form: {case: [round(x, 1) for x in v] for case, v in cpu_times[form].items()}
                                  for form in forms}
        if "concat" in forms:
            for key in ("ms", "ms_best", "cpu_ms"):
                entry[f"{key}_ratio_to_concat"] = {
                    form: {case: round(entry[key][form][case] / entry[key]["concat"][case], 3) for case in entry[key][form]}
                    for form in forms}
            entry["max_abs_logit_diff_to_concat"] = {form: float(np.abs(last[form] - last["concat"]).max())
                                                     for form in forms}
        results["models"][role] = entry
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
