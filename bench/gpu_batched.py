"""Continuous batching on the GPU, in process: N clients against one at a time on the real pair's fp16 batched pack
(issue 25; docs/batching.md, "On the GPU"; bench/README.md, "Batched on the GPU: the load benchmark").

    python bench/gpu_batched.py --work /tmp/gw --target T.gguf --draft D.gguf \\
        --prompts HumanEval.jsonl.gz mt_bench_question.jsonl spec_bench_question.jsonl --json OUT.json \\
        [--clients 1 4 16 64] [--ks auto 0] [--requests-per-client 2] [--min-requests 8] [--max-new-tokens 128]
        [--config-cap-s 150] [--alone-cap-s 300] [--gaps 16] [--device cuda] [--pack PACK] [--sampled-every N]

Export (once per --work: skipped when WORK/pack-batched holds a manifest; `--pack PATH` uses that pack instead):
`spec-export --graphs torch --kv-cache static --attention gqa --dtype fp16 --max-batch 64 --k 8 --max-len 2048 --jobs 4`
(`--dequantize` for .gguf sources). The batch-1 graphs beside the batched ones (which are always standard attention)
may be `--attention gqa` or `standard` with these options (export/config.py: `_check_batch` refuses --graphs builder,
bf16, quantized fp16, trees, heads, TensorRT, not the batch-1 attention); gqa, since GroupQueryAttention is the cuda
backend's fast batch-1 path (docs/cuda_backend.md: "fp16 (with --attention gqa for speed)"; bench/README.md, Run E:
AR on torch graphs with standard attention 225 tok/s, on the builder's GQA graphs 428), and `alone` (today's server)
should be timed at its best. The builder's graphs have no batched form (refused with --max-batch).

Configurations (`alone`, and each N, on its own load of the pack), greedy (--sampled-every N: every Nth request seeded
sampling at temperature 0.7, top_k and top_p off, as serve_load.py's; its tokens too must be alone's), --max-new-tokens
new tokens per request,
requests drawn round-robin from the prompt files (prompts over --max-prompt-tokens left out, counted), the same list
for all:
  alone      one request at a time through pack.generate (no start_batching, BackendOptions slots 1: the batch-1
             graphs with captured CUDA graphs): what `specpack serve` does today (--max-batch 1), k auto
  cN-auto    N closed-loop clients (threads: submit, wait for the result, submit the next), pack.start_batching
  cN-k0      (max_batch N, or --max-batch B for every N: a server started once), k auto (BatchKCap) and k 0; one
             load per N, both k run on it after a warm-up of N short requests at each k (up to WARMUP_ROUNDS rounds,
             again while a round still captured batched shapes; those left count in `warmup_runs_timed`). N = 1:
             the scheduler over the per-slot graphs (start_batching uses the batched engines only above one row).
             Loaded as `serve` loads (precapture "batcher": the shapes captured on the batcher's thread when it
             starts, waited for before the clients; --no-precapture: none; --prefill-budget: the scheduler's prefill
             tokens an iteration), run_clients
  c1-bB-auto one client, k auto, on a batcher of --solo-max-batch rows (16): a batching server's lone request (a solo
             row: the per-slot graphs of slot 0, runtime/scheduler.py), against `alone` (the issue's "at 1 client");
  c1-bB-batched-auto  the same with start_batching(solo=False): its row through the batched graphs at batch 1
Per configuration: aggregate throughput (new tokens over the wall time from the first submit to the last result),
time to first token p50 / p99 (submit -> first text piece: queue wait included; the pack's prefill ttft_s too),
inter-token latency p50 / p99 (per request: (last piece - first) / (tokens - 1), pieces timed as on_text gives them),
per-request decode speed p50 (stats.tokens_per_s), tau, errors (and examples), the GPU's memory used (nvidia-smi,
sampled every second: before load, peak) and the process's RSS peak (psutil); on the CPU no GPU memory. A
configuration stops taking requests at its wall-clock cap (--config-cap-s; `alone`: --alone-cap-s); those in flight
finish; `capped` says so. Speculation's share per N: cN-auto over cN-k0 (aggregate tokens/s); each over `alone`.

Greedy identity: every request's tokens against its `alone` tokens. Every divergence: the configuration, request,
prompt id, first differing position, both tokens; its prefix is the request's prompt ids (`requests`) + its alone
tokens up to the position. The first --gaps distinct (request, position) get the fp32 target's top-2 logit gap here
(specpack.bench.peer_hf.logit_gaps: transformers on the target's Hugging Face dir, which the export converted, on
the CPU of the device machine, as bench/divergence_gaps.py computes them); the rest, or all (--gaps 0), later:
`batched.rows` has divergence_gaps.py's shape (per request "id", "ar" = the alone tokens, one entry per configuration):
    python bench/divergence_gaps.py OUT.json --phases batched --target-dir HF_DIR --tokenizer PACK/tokenizer \\
        --prompts HumanEval.jsonl.gz mt_bench_question.jsonl spec_bench_question.jsonl
The gap is fp32's, not the fp16 graph's: the cuda backend's graphs give tokens, not logits (only the reference
backend's pack_logits adds a logits output, on the CPU EP), so an fp16 gap on the card would need another session of
each graph. The fp32 gaps cost the device machine's CPU about a forward of the prefix each (hence the bound); the
converted target is here too (~/.cache/specpack/converted), so the rest cost no device time.

JSON (--json, compact): settings, card, export_s, requests (id, prompt ids), configs (the measurements above, with
k histograms, draft / verify seconds, and `alone_same_requests`: today's server on the configuration's own requests),
summary (per N: auto / k0 over alone on the same requests), per_request (tokens, latency, TTFT, steps, acceptance),
batched.rows (tokens), divergences. A log line per configuration. On a pack the cpu backend runs, --device cpu is the
CPU load test (bench/README.md, "Closed-loop clients, TTFT at the client").

The HTTP load test (bench/serve_load.py with the official openai client against `specpack serve --max-batch N
--device cuda`) is not run here: bench/device/serve_load_gpu.sh runs it after this script, on wheels staged with
STAGE_SERVE=1 (bench/device/stage_head_run.sh).

Dry run on the CPU (--device cpu: the cuda backend's code on the CPU EP; a tiny pair from tests/tiny.py; about a
minute with the export):
    python -c "import sys; sys.path.insert(0, 'tests'); from pathlib import Path; import tiny; \\
        tiny.make_pair('qwen2', Path('/tmp/gb-tiny'), 'noisy', head_dim=16, max_positions=512)"
    python bench/gpu_batched.py --work /tmp/gb --target /tmp/gb-tiny/qwen2-target --draft /tmp/gb-tiny/qwen2-draft-noisy \\
        --max-len 256 --max-batch-export 4 --solo-max-batch 4 --device cpu --clients 1 2 4 --min-requests 4 \\
        --max-new-tokens 24 --max-prompt-tokens 96 --json /tmp/gb/out.json --prompts HumanEval.jsonl.gz \\
        mt_bench_question.jsonl spec_bench_question.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specpack.bench.timing import quantile

MAX_BATCH = 64      # the pack's batched graphs: the most rows a run takes
MAX_LEN = 2048
K_MAX = 8
ATTENTION = "gqa"   # the batch-1 graphs' (module docstring)
WARMUP_TOKENS = 16
WARMUP_ROUNDS = 3  # warm-up rounds per configuration at most (fewer once a round captured no new shape)
SAMPLED_TEMPERATURE = 0.7  # --sampled-every's requests (serve_load.py's)


def log(line: str) -> None:
    print(f"[gpu_batched {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def specpack_cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "specpack", *args], check=True)


# --- export, card, memory ---------------------------------------------------------------------------------------

def export_pack(args: argparse.Namespace) -> tuple[Path, float | None]:
    """The pack to run: --pack, or WORK/pack-batched (exported unless it holds a manifest); and the export's seconds."""
    if args.pack:
        return Path(args.pack), None
    pack = Path(args.work) / "pack-batched"
    if (pack / "manifest.json").is_file():
        log(f"{pack} exists: not exported again")
        return pack, None
    sources = [s for s in (args.target, args.draft) if s]
    dequantize = ["--dequantize"] if any(str(s).endswith(".gguf") for s in sources) else []
    t0 = time.perf_counter()
    specpack_cli("export", *(["--draft", args.draft] if args.draft else []), "--target", args.target, "-o", str(pack),
                 "--graphs", "torch", "--kv-cache", "static", "--attention", args.attention, "--dtype", "fp16",
                 "--max-batch", str(args.max_batch_export), "--k", str(K_MAX), "--max-len", str(args.max_len),
                 "--jobs", str(args.export_jobs), *dequantize, "--overwrite")
    export_s = time.perf_counter() - t0
    log(f"exported {pack} in {export_s:.0f} s")
    return pack, export_s


def card(device: str) -> dict[str, Any]:
    import onnxruntime as ort

    info: dict[str, Any] = {"device": device, "onnxruntime": ort.__version__, "providers": ort.get_available_providers(),
                            "cpus": os.cpu_count()}
    if device == "cuda" and shutil.which("nvidia-smi"):
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit",
             "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    return info


def gpu_memory_mib() -> int | None:
    """The first GPU's memory in use (nvidia-smi, MiB), or None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


class MemorySampler:
    """Peak GPU memory used (nvidia-smi, device cuda only) and peak RSS of this process, sampled every second."""

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu
        self.before_mib = gpu_memory_mib() if gpu else None
        self.peak_mib = self.before_mib
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        try:
            import psutil

            self.peak_rss = max(self.peak_rss, psutil.Process().memory_info().rss)
        except ImportError:
            pass
        if self.gpu and (used := gpu_memory_mib()) is not None:
            self.peak_mib = max(self.peak_mib or 0, used)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self._sample()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        self._sample()
        return {"gpu_used_before_load_mib": self.before_mib, "gpu_used_peak_mib": self.peak_mib,
                "rss_peak_bytes": self.peak_rss or None}


def open_pack(pack_dir: Path, device: str, slots: int, precapture: bool | str = True) -> Any:
    """The pack on the cuda backend (specpack.load), or with device "cpu": a pack the cpu backend runs (fp32, int8,
    int4) on it, an fp16 pack (which the cpu backend refuses) on the cuda backend's code over the CPU EP (the dry run;
    as tests/runtime/test_cuda_batched.py opens it). precapture: BackendOptions.precapture (True: at load and on a
    batcher's thread; "batcher": on a batcher's thread alone, as `serve` loads; backends/cuda_precapture.py)."""
    import specpack
    from specpack.contract.manifest import Manifest
    from specpack.runtime.backend import BackendOptions

    options = BackendOptions(slots=slots, precapture=precapture)  # type: ignore[arg-type]
    if device == "cuda":
        return specpack.load(pack_dir, device="cuda", options=options)
    if Manifest.read(pack_dir).target.dtype != "fp16":
        return specpack.load(pack_dir, device="cpu", options=BackendOptions(slots=slots))
    from specpack.runtime.backends.cuda import CudaBackend
    from specpack.runtime.pack import Pack
    from specpack.runtime.tokenizer import PackTokenizer

    manifest = Manifest.read(pack_dir)
    backend = CudaBackend(pack_dir, manifest, options, device="cpu", precapture=False)
    return Pack(pack_dir, manifest, PackTokenizer.load(pack_dir / "tokenizer"), backend, slots=slots)


# --- requests ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Planned:
    index: int
    id: str
    chat: bool
    ids: tuple[int, ...]   # the prompt's token ids (chat template applied)
    temperature: float = 0.0  # > 0: seeded sampling (--sampled-every), its seed the request's index

    def request(self, max_new_tokens: int, k: int | None = None) -> Any:
        """The request as every configuration submits it (a sampled one with its seed: the same tokens alone and
        batched, docs/batching.md)."""
        from specpack.runtime.request import GenerateRequest
        from specpack.sampling import SamplingParams

        if not self.temperature:
            return GenerateRequest(self.ids, max_new_tokens, k=k)
        return GenerateRequest(self.ids, max_new_tokens, k=k, sampling=SamplingParams(self.temperature), seed=self.index)


def plan(pack_dir: Path, files: list[str], n: int, max_prompt_tokens: int, sampled_every: int = 0
         ) -> tuple[list[Planned], int]:
    """The first n prompts, round-robin over the files (each in its order), encoded as Pack.encode does (the pack's
    tokenizer alone: no session opened), prompts over max_prompt_tokens left out (returned: how many); every
    `sampled_every`-th seeded sampling at SAMPLED_TEMPERATURE (serve_load.py's plan: top_k and top_p left off, as an
    OpenAI client sends them: the cuda backend's plain sampling form)."""
    from specpack.prompts import read_prompts
    from specpack.runtime.tokenizer import PackTokenizer

    tokenizer = PackTokenizer.load(pack_dir / "tokenizer")

    per_file = [read_prompts([f]) for f in files]
    out: list[Planned] = []
    skipped, at = 0, [0] * len(per_file)
    while len(out) < n and any(a < len(p) for a, p in zip(at, per_file, strict=True)):
        for f, prompts in enumerate(per_file):
            if len(out) >= n or at[f] >= len(prompts):
                continue
            prompt = prompts[at[f]]
            at[f] += 1
            ids = tokenizer.encode_chat(prompt.text) if prompt.chat else tokenizer.encode(prompt.text)
            if len(ids) > max_prompt_tokens:
                skipped += 1
                continue
            index = len(out)
            sampled = sampled_every > 0 and index % sampled_every == sampled_every - 1
            out.append(Planned(index, prompt.id, prompt.chat, tuple(ids), SAMPLED_TEMPERATURE if sampled else 0.0))
    return out, skipped


@dataclass
class Outcome:
    index: int
    tokens: list[int] = field(default_factory=list)
    error: str | None = None
    ttft_s: float | None = None        # submit -> first text piece (queue wait included)
    itl_s: float | None = None         # (last piece - first) / (tokens - 1)
    latency_s: float | None = None     # submit -> result
    stats: dict[str, Any] = field(default_factory=dict)


class PieceClock:
    """on_text: the time of the first and the last text piece."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None

    def __call__(self, piece: str) -> None:
        now = time.perf_counter()
        if piece:
            self.first = now if self.first is None else self.first
            self.last = now


def finish(out: Outcome, t0: float, clock: PieceClock, generation: Any) -> None:
    out.tokens = list(generation.tokens)
    out.latency_s = time.perf_counter() - t0
    out.stats = {key: generation.stats.get(key) for key in ("new_tokens", "steps", "proposed", "accepted", "ttft_s",
                                                             "decode_s", "tokens_per_s", "k_histogram",
                                                             "k_asked_histogram", "draft_s", "verify_s")}
    if clock.first is not None:
        out.ttft_s = clock.first - t0
        if clock.last is not None and len(out.tokens) > 1:
            out.itl_s = (clock.last - clock.first) / (len(out.tokens) - 1)


# --- configurations ---------------------------------------------------------------------------------------------

def run_alone(pack_dir: Path, args: argparse.Namespace, planned: list[Planned]) -> tuple[dict[str, Any], list[Outcome]]:
    """One request at a time through pack.generate_request (no batching): today's server."""
    memory = MemorySampler(args.device == "cuda")
    t0 = time.perf_counter()
    with open_pack(pack_dir, args.device, 1) as pack:
        load_s = time.perf_counter() - t0
        pack.generate(list(planned[0].ids), WARMUP_TOKENS)  # warm-up: sessions, the draft, first runs
        outcomes: list[Outcome] = []
        deadline = time.perf_counter() + args.alone_cap_s
        start = time.perf_counter()
        for p in planned:
            if time.perf_counter() > deadline:
                break
            out, clock = Outcome(p.index), PieceClock()
            t = time.perf_counter()
            try:
                finish(out, t, clock, pack.generate_request(p.request(args.max_new_tokens), on_text=clock))
            except Exception as err:  # counted; the run goes on
                out.error = f"{type(err).__name__}: {err}"[:300]
            outcomes.append(out)
        wall = time.perf_counter() - start
        costs = policy_costs(pack)
    return summarize("alone", 1, None, outcomes, wall, load_s, len(planned), memory.stop()) | costs, outcomes


def policy_costs(pack: Any) -> dict[str, Any]:
    """The k policies' step costs as the pack carries them to its next request (adaptive_k.MeasuredCosts): per
    drafter, V(k) by k and d, in ms, so a k policy's choices can be read against what it measured."""
    from specpack.runtime.adaptive_k import MeasuredCosts

    out = {}
    for (drafter, size), costs in pack._costs.items():
        if isinstance(costs, MeasuredCosts):
            points, d = costs._known()
            out[f"{drafter}/{size}"] = {"verify_ms": {k: 1e3 * v for k, v in points}, "per_draft_ms": 1e3 * d}
    return {"policy_costs": out}


def closed_loop(pack: Any, planned: list[Planned], clients: int, k: int | None, max_new_tokens: int,
                cap_s: float) -> tuple[list[Outcome], float, bool]:
    """`clients` threads, each submitting a request and waiting for its result, then the next, until the list is
    done or cap_s passed (those in flight finish). Returns the outcomes, the wall time, whether the cap stopped it."""

    todo = list(reversed(planned))
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    capped = threading.Event()
    start = time.perf_counter()
    deadline = start + cap_s

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                if time.perf_counter() > deadline:
                    capped.set()
                    return
                p = todo.pop()
            out, clock = Outcome(p.index), PieceClock()
            t = time.perf_counter()
            try:
                handle = pack.submit(p.request(max_new_tokens, k), on_text=clock)
                finish(out, t, clock, handle.result())
            except Exception as err:  # counted; the client goes on
                out.error = f"{type(err).__name__}: {err}"[:300]
            with lock:
                outcomes.append(out)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(outcomes, key=lambda o: o.index), time.perf_counter() - start, capped.is_set()


def run_clients(pack_dir: Path, args: argparse.Namespace, planned: list[Planned], clients: int,
                ks: list[int | None], max_batch: int = 0, solo: bool = True
                ) -> list[tuple[str, dict[str, Any], list[Outcome]]]:
    """N clients on one load of the pack (batching with max_batch: this, or --max-batch, or N), each k in turn;
    solo False: a request admitted alone runs through the batched graphs too (start_batching's solo; "-batched")."""
    max_batch = max_batch or args.max_batch or clients
    suffix = ("" if max_batch == clients else f"-b{max_batch}") + ("" if solo else "-batched")
    # as `serve` loads: the shapes captured on the batcher's thread when it starts, nothing at load (precapture
    # "batcher": backends/cuda_precapture.py); --no-precapture: none (load_s, which waits for them, says what it costs)
    precapture = False if args.no_precapture else "batcher"
    n = max(args.min_requests, args.requests_per_client * clients)
    results = []
    memory = MemorySampler(args.device == "cuda")
    t0 = time.perf_counter()
    with open_pack(pack_dir, args.device, max_batch, precapture) as pack:
        batcher = pack.start_batching(max_batch=max_batch, prefill_budget=args.prefill_budget, solo=solo)
        batcher.prepared.wait()
        rows: list[int] = []
        batcher.on_step = rows.append  # rows decoding at each iteration
        load_s = time.perf_counter() - t0
        verifier = type(batcher.scheduler.verifier).__name__
        for k in ks:  # warm-up: `clients` short requests at once, each k (sessions, the batch shapes up to N rows),
            for _ in range(WARMUP_ROUNDS):  # again while a round still captured shapes (the backend's warm-up runs)
                before = pack.backend.warmup_runs()
                handles = [pack.submit(p.request(WARMUP_TOKENS, k)) for p in planned[:clients]]
                for handle in handles:
                    handle.result()
                if pack.backend.warmup_runs() == before:
                    break
        for k in ks:
            rows.clear()
            warmups = pack.backend.warmup_runs()
            outcomes, wall, capped = closed_loop(pack, planned[:n], clients, k, args.max_new_tokens, args.config_cap_s)
            name = f"c{clients}{suffix}-{'auto' if k is None else f'k{k}'}"
            result = summarize(name, clients, k, outcomes, wall, load_s, n, None, capped=capped)
            result |= {"max_batch": max_batch, "solo": solo, "precapture": precapture, "verifier": verifier,
                       "iterations": len(rows),
                       "rows_per_iteration_mean": statistics.fmean(rows) if rows else None,
                       # shapes first run (captured) inside the timed part: each such run costs several replays
                       "warmup_runs_timed": pack.backend.warmup_runs() - warmups} | policy_costs(pack)
            results.append((name, result, outcomes))
        mem = memory.stop()
        captured = batched_capture(batcher)
    for _, result, _ in results:
        result["memory"] = mem  # one load for both k: its peak
        result["batched_capture"] = captured
    return results


def batched_capture(batcher: Any) -> dict[str, Any]:
    """Per batched session (the target's verify graph, its greedy and plain forms, the draft's graph): whether it captures CUDA
    graphs, how many shapes it captured, why a capture was refused (backends/cuda_batched.py)."""
    engines = {"target": batcher.scheduler.verifier,
               "draft": getattr(batcher.scheduler.row_drafter, "engine", None)}
    out: dict[str, Any] = {}
    for label, engine in engines.items():
        caches = getattr(engine, "caches", None)
        forms = (("", "session"), (" greedy form", "greedy_session"), (" plain form", "plain_session"))
        for form, session in ((form, getattr(caches, attr, None)) for form, attr in forms):
            if session is not None and hasattr(session, "graphs_captured"):
                out[label + form] = {"capture": session.capture, "captured_shapes": session.graphs_captured,
                                     "refused": session.error}
    return out


def k_histogram(outcomes: list[Outcome], key: str = "k_histogram") -> list[int]:
    """[k + 1] steps per k over the requests (each Generation's stats[key] summed: verified k, or k_asked_histogram)."""
    total: list[int] = []
    for o in outcomes:
        for k, n in enumerate(o.stats.get(key) or []):
            total.extend([0] * (k + 1 - len(total)))
            total[k] += n
    return total


def summarize(name: str, clients: int, k: int | None, outcomes: list[Outcome], wall: float, load_s: float,
              planned: int, memory: dict[str, Any] | None, capped: bool = False) -> dict[str, Any]:
    ok = [o for o in outcomes if o.error is None]
    errors = [o for o in outcomes if o.error is not None]
    tokens = sum(len(o.tokens) for o in ok)
    steps = sum(o.stats.get("steps") or 0 for o in ok)
    ttft = [o.ttft_s for o in ok if o.ttft_s is not None]
    itl = [o.itl_s for o in ok if o.itl_s is not None]
    prefill = [o.stats["ttft_s"] for o in ok if o.stats.get("ttft_s") is not None]
    speed = [o.stats["tokens_per_s"] for o in ok if o.stats.get("tokens_per_s")]
    latency = [o.latency_s for o in ok if o.latency_s is not None]
    result: dict[str, Any] = {"clients": clients, "k": "auto" if k is None else k, "requests_planned": planned,
              "requests_done": len(outcomes), "ok": len(ok), "errors": len(errors),
              "error_examples": [o.error for o in errors[:3]], "capped": capped, "load_s": load_s, "wall_s": wall,
              "tokens": tokens, "tokens_per_s": tokens / wall if wall else None, "tau": tokens / steps if steps else None,
              "ttft_s": {"p50": quantile(ttft, 0.5), "p99": quantile(ttft, 0.99), "n": len(ttft)},
              "itl_s": {"p50": quantile(itl, 0.5), "p99": quantile(itl, 0.99), "n": len(itl)},
              "prefill_ttft_s": {"p50": quantile(prefill, 0.5), "p99": quantile(prefill, 0.99)},
              "latency_s": {"p50": quantile(latency, 0.5), "p99": quantile(latency, 0.99)},
              "request_tokens_per_s_p50": quantile(speed, 0.5), "memory": memory,
              "proposed": sum(o.stats.get("proposed") or 0 for o in ok),
              "accepted": sum(o.stats.get("accepted") or 0 for o in ok), "k_histogram": k_histogram(ok),
              "k_asked_histogram": k_histogram(ok, "k_asked_histogram"),
              "draft_s": sum(o.stats.get("draft_s") or 0.0 for o in ok),
              "verify_s": sum(o.stats.get("verify_s") or 0.0 for o in ok)}
    ttft50, itl50 = result["ttft_s"]["p50"], result["itl_s"]["p50"]
    log(f"{name}: {len(ok)}/{planned} ok, {len(errors)} errors{' (capped)' if capped else ''}, "
        f"{result['tokens_per_s'] or 0:.1f} tok/s, TTFT p50 {ttft50 or 0:.3f} s, ITL p50 {(itl50 or 0) * 1e3:.2f} ms, "
        f"tau {result['tau'] or 0:.2f}, {wall:.1f} s" + (f", GPU peak {memory['gpu_used_peak_mib']} MiB"
                                                          if memory and memory.get("gpu_used_peak_mib") else ""))
    return result


# --- identity and gaps ------------------------------------------------------------------------------------------

def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where a and b differ (the shorter's end if one is the other's prefix); None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def divergences(alone: dict[int, Outcome], runs: dict[str, list[Outcome]], planned: list[Planned]
                ) -> list[dict[str, Any]]:
    found = []
    for name, outcomes in runs.items():
        for out in outcomes:
            ref = alone.get(out.index)
            if out.error is not None or ref is None or ref.error is not None:
                continue
            i = first_difference(ref.tokens, out.tokens)
            if i is None:
                continue
            record: dict[str, Any] = {"config": name, "request": out.index, "id": planned[out.index].id, "position": i,
                                      "sampled": planned[out.index].temperature > 0}
            if i < min(len(ref.tokens), len(out.tokens)):
                record |= {"alone_token": ref.tokens[i], "other_token": out.tokens[i]}
            else:
                record["note"] = "one output is a prefix of the other"
            found.append(record)
    return found


def add_gaps(found: list[dict[str, Any]], alone: dict[int, Outcome], planned: list[Planned], pack_dir: Path,
             limit: int) -> str | None:
    """The fp32 target's top-2 logit gap at the first `limit` distinct (request, position) divergences (the prefix is
    the prompt + the alone tokens before the position: the same for every configuration that left there)."""
    from specpack.bench.peer_hf import logit_gaps
    from specpack.contract.manifest import Manifest

    # greedy ones only: a sampled token's divergence is no near tie of the argmax
    keys = list(dict.fromkeys((d["request"], d["position"]) for d in found
                              if "alone_token" in d and not d["sampled"]))[:limit]
    if not keys:
        return None
    target_dir = Manifest.read(pack_dir).target.source.resolved
    requests = [{"prompt": n, "position": pos, "prefix": [*planned[r].ids, *alone[r].tokens[:pos]]}
                for n, (r, pos) in enumerate(keys)]
    gaps, note = logit_gaps(target_dir, requests, threads=os.cpu_count() or 1, dtype="fp32")
    by_key = {keys[g["prompt"]]: g for g in gaps}
    for d in found:
        if (g := by_key.get((d["request"], d["position"]))) is not None:
            d |= {"fp32_top2": g["top2_tokens"], "fp32_top2_logits": [round(v, 4) for v in g["top2_logits"]],
                  "fp32_gap": round(g["gap"], 4)}
    left = len({(d["request"], d["position"]) for d in found if "alone_token" in d and not d["sampled"]}) - len(keys)
    return note or (f"{left} divergences' gaps left to bench/divergence_gaps.py (--gaps {limit})" if left else None)


def alone_on(outcomes: list[Outcome], alone: dict[int, Outcome]) -> dict[str, Any] | None:
    """Today's server on the requests a configuration ran (its first N of the plan, not alone's whole list): tokens
    over the sum of their latencies, one after another, and their own speeds and TTFTs."""
    same = [alone[o.index] for o in outcomes if o.index in alone and alone[o.index].error is None]
    seconds = sum(o.latency_s or 0.0 for o in same)
    if not same or not seconds:
        return None
    return {"requests": len(same), "tokens_per_s": sum(len(o.tokens) for o in same) / seconds,
            "request_tokens_per_s_p50": quantile([o.stats["tokens_per_s"] for o in same if o.stats.get("tokens_per_s")],
                                                 0.5),
            "ttft_s_p50": quantile([o.ttft_s for o in same if o.ttft_s is not None], 0.5)}


def summary(configs: dict[str, Any], clients: list[int]) -> dict[str, Any]:
    """Per N: aggregate tokens/s of k auto over k 0 (speculation's share), each over alone on the same requests
    (`alone_same_requests`; alone's whole list where that is missing); TTFT p50."""
    out: dict[str, Any] = {}
    for n in clients:
        auto, k0 = configs.get(f"c{n}-auto"), configs.get(f"c{n}-k0")
        entry: dict[str, Any] = {}
        if auto and k0 and k0["tokens_per_s"]:
            entry["speculation_auto_over_k0"] = auto["tokens_per_s"] / k0["tokens_per_s"]
        for name, c in (("auto", auto), ("k0", k0)):
            alone = (c or {}).get("alone_same_requests") or configs.get("alone")
            if c and alone and alone["tokens_per_s"]:
                entry[f"{name}_over_alone"] = c["tokens_per_s"] / alone["tokens_per_s"]
                entry[f"{name}_ttft_p50_s"] = c["ttft_s"]["p50"]
                entry[f"{name}_request_speed_over_alone"] = (
                    c["request_tokens_per_s_p50"] / alone["request_tokens_per_s_p50"]
                    if c["request_tokens_per_s_p50"] and alone["request_tokens_per_s_p50"] else None)
        out[str(n)] = entry
    return out


# --- main -------------------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, help="where the pack is exported (WORK/pack-batched)")
    parser.add_argument("--target", help="the target: a .gguf (the 1.5B) or a Hugging Face dir (needed to export)")
    parser.add_argument("--draft", help="the draft: a .gguf (the 0.5B) or a Hugging Face dir")
    parser.add_argument("--pack", help="an exported pack with --max-batch (no export)")
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a pack the cpu backend runs, on it (the CPU load test); an fp16 pack: the cuda "
                             "backend's code on the CPU EP (a dry run on a tiny pack)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--ks", nargs="+", default=["auto", "0"], help="k per batched configuration (auto or a number)")
    parser.add_argument("--max-batch", type=int, default=0,
                        help="the batcher's max_batch for every N (0: N, the clients; a server started once: 64)")
    parser.add_argument("--solo-max-batch", type=int, default=16,
                        help="also 1 client, k auto, on a batcher of this many rows (c1-bB-auto; 0 or 1: not run)")
    parser.add_argument("--no-precapture", action="store_true",
                        help="no per-slot shape pre-captured at load (serve pre-captures them, on slot 0 alone for a "
                             "batched pack above one row)")
    parser.add_argument("--prefill-budget", type=int, default=None,
                        help="prompt tokens prefilled per iteration (Pack.start_batching; default: the scheduler's)")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--min-requests", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--config-cap-s", type=float, default=150.0, help="a batched configuration's wall-clock cap")
    parser.add_argument("--alone-cap-s", type=float, default=300.0)
    parser.add_argument("--gaps", type=int, default=16, help="divergences whose fp32 gap is computed here (0: none)")
    parser.add_argument("--sampled-every", type=int, default=0,
                        help=f"every Nth request seeded sampling at temperature {SAMPLED_TEMPERATURE} (0: all greedy)")
    parser.add_argument("--max-len", type=int, default=MAX_LEN, help="export's --max-len")
    parser.add_argument("--export-jobs", type=int, default=4,
                        help="export's --jobs: its four torch exports at once (the device machine's 16 cores and 128 GB: "
                             "one after another they took over 9 minutes of an H200 session, bench/README.md)")
    parser.add_argument("--max-batch-export", type=int, default=MAX_BATCH, help="export's --max-batch")
    parser.add_argument("--attention", default=ATTENTION, help="export's --attention for the batch-1 graphs")
    parser.add_argument("--only", nargs="*", help="configurations to run (alone, c4-auto, ...); default all")
    args = parser.parse_args()
    if not args.pack and not args.target:
        parser.error("--target (to export) or --pack is needed")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    ks: list[int | None] = [None if k == "auto" else int(k) for k in args.ks]
    result: dict[str, Any] = {"settings": {key: value for key, value in vars(args).items()}, "card": card(args.device),
                              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}

    def write() -> None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, separators=(",", ":"), default=str))

    pack_dir, result["export_s"] = export_pack(args)
    result["pack"] = str(pack_dir)
    from specpack.contract.manifest import Manifest

    n_max = max(max(args.min_requests, args.requests_per_client * n) for n in args.clients)
    batched = Manifest.read(pack_dir).target.batched
    result["pack_max_batch"] = batched.max_batch if batched else None
    planned, skipped = plan(pack_dir, args.prompts, n_max, args.max_prompt_tokens, args.sampled_every)
    result["requests"] = [{"i": p.index, "id": p.id, "chat": p.chat, "prompt_ids": list(p.ids),
                           "temperature": p.temperature} for p in planned]
    result["prompts_too_long"] = skipped
    log(f"{len(planned)} requests planned ({skipped} prompts over {args.max_prompt_tokens} tokens left out)")
    wanted = set(args.only) if args.only else None
    configs: dict[str, Any] = {}
    runs: dict[str, list[Outcome]] = {}
    alone: dict[int, Outcome] = {}
    if wanted is None or "alone" in wanted:
        configs["alone"], outcomes = run_alone(pack_dir, args, planned)
        alone = {o.index: o for o in outcomes}
        runs["alone"] = outcomes
        result["configs"] = configs
        write()
    for n in args.clients:
        n_ks = [k for k in ks if wanted is None or f"c{n}-{'auto' if k is None else f'k{k}'}" in wanted]
        if not n_ks:
            continue
        try:
            for name, config, outcomes in run_clients(pack_dir, args, planned, n, n_ks):
                configs[name], runs[name] = config, outcomes
        except Exception as err:  # recorded; the next N runs
            configs[f"c{n}-error"] = repr(err)[:500]
            log(f"clients {n} failed: {err!r}")
        result["configs"] = configs
        write()
    for solo, label in ((True, ""), (False, "-batched")):  # the "at 1 client" against alone: solo rows (the
        name = f"c1-b{args.solo_max_batch}{label}-auto"        # default) and, before them, the batched graphs at batch 1
        if args.solo_max_batch <= 1 or (wanted is not None and name not in wanted):
            continue
        try:  # one client on a batcher of solo_max_batch rows
            for name, config, outcomes in run_clients(pack_dir, args, planned, 1, [None], args.solo_max_batch, solo):
                configs[name], runs[name] = config, outcomes
        except Exception as err:
            configs[f"c1-solo{label}-error"] = repr(err)[:500]
            log(f"one client on max_batch {args.solo_max_batch} (solo {solo}) failed: {err!r}")
        result["configs"] = configs
        write()
    for name, outcomes in runs.items():
        if name != "alone" and isinstance(configs.get(name), dict):
            configs[name]["alone_same_requests"] = alone_on(outcomes, alone)
    result["summary"] = summary(configs, args.clients)
    for label in ("", "-batched"):
        if (one := configs.get(f"c1-b{args.solo_max_batch}{label}-auto")) and configs.get("alone"):
            alone_speed = (one.get("alone_same_requests") or configs["alone"])["request_tokens_per_s_p50"]
            result["summary"][f"one_client_batcher{label.replace('-', '_')}"] = {
                "max_batch": args.solo_max_batch, "solo": not label,
                "request_speed_over_alone": one["request_tokens_per_s_p50"] / alone_speed if alone_speed else None,
                "latency_p50_over_alone": (one["latency_s"]["p50"] / configs["alone"]["latency_s"]["p50"]
                                           if configs["alone"]["latency_s"]["p50"] else None)}
    result["per_request"] = {name: [{"i": o.index, "tokens": len(o.tokens), "latency_s": o.latency_s, "ttft_s": o.ttft_s,
                                     **{key: o.stats.get(key) for key in ("steps", "proposed", "accepted")}}
                                    for o in outcomes if o.error is None] for name, outcomes in runs.items()}
    result["batched"] = {"rows": [{"id": p.id, "request": p.index, "ar": {"tokens": alone[p.index].tokens},
                                   **{name: {"tokens": o.tokens} for name, outs in runs.items() if name != "alone"
                                      for o in outs if o.index == p.index and o.error is None}}
                                  for p in planned if p.index in alone and alone[p.index].error is None]}
    found = divergences(alone, {name: outs for name, outs in runs.items() if name != "alone"}, planned)
    result["divergences"] = found
    log(f"divergences from alone: {len(found)} "
        f"({len({(d['request'], d['position']) for d in found})} distinct request/position)")
    write()
    if found and args.gaps:
        t0 = time.perf_counter()
        result["gaps_note"] = add_gaps(found, alone, planned, pack_dir, args.gaps)
        result["gaps_s"] = time.perf_counter() - t0
        log(f"gaps: {sum('fp32_gap' in d for d in found)} of {len(found)} in {result['gaps_s']:.0f} s"
            + (f"; {result['gaps_note']}" if result["gaps_note"] else ""))
    log(json.dumps(result["summary"]))
    write()


if __name__ == "__main__":
    main()
