"""Load test of `specpack serve` with the official openai client, on loopback only, bounded in requests and time.

Starts `specpack serve PACK` on 127.0.0.1 (a free port), then N concurrent clients send the planned requests:
plain completions of code prompts and chat completions of instructions, in turn; every third request streams;
`--cancel` of the streaming ones are closed by their client after a few chunks (a deliberate disconnect; one whose
model stops first is counted `stopped`, not an error). Streams give the time to first token and the inter-token
latency; `--k 0` against `--k auto` gives speculation's share (bench/README.md, "Load tests at 1, 4 and 16 clients").
Greedy requests of the same prompt must give the same text (one decode at a time, the pack reset between).
The server's RSS is read after every finished request; its growth is reported between the request a third of
the way through (request 100 of 300) and the last. Stops taking requests at --time-limit; stopped by SIGTERM, it
writes what finished, marked "interrupted".

Prompts may be cut to their first --max-prompt-chars characters, and the cancelled streams may ask for more
tokens (--cancel-max-tokens) than the others, so that they are still decoding when their client leaves: the
run then fits a bounded time on a CPU while every request still goes the whole way through the server.

    python bench/serve_load.py PACK --prompts HumanEval.jsonl.gz 8 --prompts mt_bench_question.jsonl 1 \
        [--requests 300] [--clients 16] [--cancel 30] [--max-tokens 24] [--cancel-max-tokens 64] \
        [--cancel-after 2] [--max-prompt-chars 160] [--max-batch 1] [--k auto] [--json bench/results/serve_load_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import queue
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import openai
import psutil

from specpack.bench.report import machine_info
from specpack.bench.timing import quantile
from specpack.prompts import BenchPrompt, read_prompts


@dataclass(frozen=True)
class Planned:
    index: int
    prompt: BenchPrompt
    stream: bool
    cancel: bool
    temperature: float   # 0: greedy (checked for consistency); else seeded sampling


@dataclass
class Outcome:
    index: int
    prompt_id: str
    chat: bool
    stream: bool
    cancel: bool
    temperature: float
    status: str = "pending"          # ok | cancelled | stopped (a stream to cancel that hit EOS first) | error
    error: str | None = None
    ttft_s: float | None = None      # streaming: request sent -> first text chunk (queue wait included)
    itl_s: float | None = None       # streaming: (last text chunk - first) / (completion tokens - 1): inter-token latency
    latency_s: float | None = None   # request sent -> last byte
    completion_tokens: int | None = None
    text: str = ""
    speculation: dict[str, Any] | None = None
    rss_after: int | None = None     # server RSS (bytes) when this request finished
    finished_nth: int | None = None  # 1 for the first request to finish, ...


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    finished: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)  # set: no client starts another request


def plan(prompts: list[BenchPrompt], n: int, n_cancel: int, sampled_every: int) -> list[Planned]:
    """Plain completions and chat completions in turn (each cycling through its prompts); every third request
    streams; the cancelled ones are spread evenly over the streaming ones; every `sampled_every`-th samples."""
    plain, chat = [p for p in prompts if not p.chat], [p for p in prompts if p.chat]
    kinds = [kind for kind in (plain, chat) if kind]
    streaming = [i for i in range(n) if i % 3 == 0]
    step = len(streaming) / max(n_cancel, 1)
    cancelled = {streaming[int(j * step)] for j in range(n_cancel)}
    return [Planned(i, kinds[i % len(kinds)][(i // len(kinds)) % len(kinds[i % len(kinds)])], i % 3 == 0,
                    i in cancelled, 0.7 if sampled_every and i % sampled_every == sampled_every - 1 else 0.0)
            for i in range(n)]


@dataclass(frozen=True)
class Budget:
    max_tokens: int         # of every request but the cancelled ones
    cancel_max_tokens: int  # of the cancelled streams
    cancel_after: int       # a cancelled stream is closed after this many chunks with text


def send(client: openai.OpenAI, model: str, p: Planned, budget: Budget, out: Outcome) -> None:
    """One request; fills `out` (never raises)."""
    max_tokens = budget.cancel_max_tokens if p.cancel else budget.max_tokens
    options: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": p.temperature}
    if p.temperature:
        options["seed"] = p.index
    create = client.chat.completions.create if p.prompt.chat else client.completions.create
    key = "messages" if p.prompt.chat else "prompt"
    value: Any = [{"role": "user", "content": p.prompt.text}] if p.prompt.chat else p.prompt.text
    t0 = time.perf_counter()
    try:
        if not p.stream:
            resp = create(**{key: value}, **options)
            choice = resp.choices[0]
            out.text = choice.message.content if p.prompt.chat else choice.text
            out.completion_tokens = resp.usage.completion_tokens if resp.usage else None
            out.speculation = (resp.model_extra or {}).get("speculation")
            out.status = "ok" if choice.finish_reason in ("stop", "length") else "error"
        else:
            stream = create(**{key: value}, **options, stream=True, stream_options={"include_usage": True})
            chunks, last, finish = 0, 0.0, None
            for chunk in stream:
                if chunk.usage is not None:
                    out.completion_tokens = chunk.usage.completion_tokens
                if not chunk.choices:
                    continue
                piece = (chunk.choices[0].delta.content if p.prompt.chat else chunk.choices[0].text) or ""
                if piece:
                    chunks += 1
                    out.text += piece
                    last = time.perf_counter() - t0
                    if out.ttft_s is None:
                        out.ttft_s = last
                if chunk.choices[0].finish_reason is not None:
                    finish = chunk.choices[0].finish_reason
                    out.speculation = (chunk.model_extra or {}).get("speculation")
                if p.cancel and chunks >= budget.cancel_after:
                    stream.close()
                    out.status = "cancelled"
                    break
            else:
                out.status = "ok" if out.text else "error"
                if out.ttft_s is not None and out.completion_tokens and out.completion_tokens > 1:
                    out.itl_s = (last - out.ttft_s) / (out.completion_tokens - 1)
            if p.cancel and out.status == "ok" and finish == "stop":  # the model's EOS came before the cancel
                out.status = "stopped"
        if p.cancel and out.status not in ("cancelled", "stopped"):
            out.status, out.error = "error", "the stream ended before it could be cancelled"
    except Exception as err:  # an error of the server: counted, the run goes on
        out.status, out.error = "error", f"{type(err).__name__}: {err}"[:300]
    out.latency_s = time.perf_counter() - t0


def client_loop(base_url: str, model: str, work: queue.Queue[Planned], run: Run, budget: Budget,
                deadline: float, server: psutil.Process) -> None:
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600) as client:
        while time.monotonic() < deadline and not run.stop.is_set():
            try:
                p = work.get_nowait()
            except queue.Empty:
                return
            out = Outcome(p.index, p.prompt.id, p.prompt.chat, p.stream, p.cancel, p.temperature)
            send(client, model, p, budget, out)
            with run.lock:
                if run.stop.is_set():  # the run was stopped while this request was in flight: not counted
                    return
                run.finished += 1
                out.finished_nth = run.finished
                out.rss_after = server.memory_info().rss
                run.outcomes.append(out)


def start_server(pack: Path, port: int, log: Path, max_queue: int, max_batch: int = 1,
                 k: str = "auto", device: str = "cpu") -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-c", "from specpack.cli.main import cli; cli()", "serve", str(pack), "--host", "127.0.0.1",
           "--port", str(port), "--max-queue", str(max_queue), "--max-batch", str(max_batch), "--timeout", "1200",
           "--model-name", "pair", "--k", k, "--device", device]
    with log.open("wb") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)


def wait_ready(client: openai.OpenAI, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            client.models.list()
            return
        except openai.APIConnectionError:
            time.sleep(0.5)
    raise SystemExit("the server did not start in time")


def summarize(outcomes: list[Outcome], wall_s: float, planned: int) -> dict[str, Any]:
    done = sorted(outcomes, key=lambda o: o.finished_nth or 0)
    ok = [o for o in done if o.status == "ok"]
    errors = [o for o in done if o.status == "error"]
    ttft = [o.ttft_s for o in ok if o.stream and o.ttft_s is not None]
    itl = [o.itl_s for o in ok if o.stream and o.itl_s is not None]
    prefill = [o.speculation["ttft_s"] for o in ok if o.speculation]
    decode_tps = [o.speculation["tokens_per_s"] for o in ok if o.speculation and o.speculation["tokens_per_s"]]
    tokens = sum(o.completion_tokens or 0 for o in ok)
    rss = {o.finished_nth: o.rss_after for o in done}
    first = len(done) // 3  # request 100 of 300
    rss_first, rss_last = rss.get(first), rss.get(len(done))
    greedy: dict[tuple[str, bool], set[str]] = {}
    for o in ok:
        if o.temperature == 0:
            greedy.setdefault((o.prompt_id, o.chat), set()).add(o.text)
    return {
        "requests_planned": planned, "requests_finished": len(done),
        "ok": len(ok), "cancelled": sum(o.status == "cancelled" for o in done), "errors": len(errors),
        "stopped_before_cancel": sum(o.status == "stopped" for o in done),
        "error_examples": [o.error for o in errors[:5]],
        "streaming": sum(o.stream for o in done), "chat": sum(o.chat for o in done),
        "sampled": sum(o.temperature > 0 for o in done),
        "wall_s": wall_s,
        "ttft_streaming_s": {"p50": quantile(ttft, 0.5), "p99": quantile(ttft, 0.99), "n": len(ttft)},
        "itl_streaming_s": {"p50": quantile(itl, 0.5), "p99": quantile(itl, 0.99), "n": len(itl)},
        "prefill_s": {"p50": quantile(prefill, 0.5), "p99": quantile(prefill, 0.99), "n": len(prefill)},
        "latency_s": {"p50": quantile([o.latency_s or 0 for o in ok], 0.5),
                      "p99": quantile([o.latency_s or 0 for o in ok], 0.99)},
        "throughput_tokens_per_s": tokens / wall_s if wall_s else None,
        "completion_tokens_ok": tokens,
        "decode_tokens_per_s": {"p50": quantile(decode_tps, 0.5), "p99_low": quantile(decode_tps, 0.01)},
        "alpha_mean": statistics.fmean(o.speculation["alpha"] for o in ok if o.speculation) if prefill else None,
        "tau_mean": statistics.fmean(o.speculation["tau"] for o in ok if o.speculation) if prefill else None,
        "rss_bytes": {"first_n": first, "after_first": rss_first, "after_last": rss_last, "last_n": len(done),
                      "growth": (rss_last - rss_first) / rss_first if rss_first and rss_last else None,
                      "max": max((o.rss_after or 0) for o in done) if done else None},
        "greedy_consistent": all(len(texts) == 1 for texts in greedy.values()),
        "greedy_prompts_repeated": sum(1 for texts in greedy.values() if texts),
    }


def scrape(root_url: str) -> dict[str, float]:
    """The server's counters worth keeping (requests by status, cancellations, tokens, rows per batch step)."""
    with urllib.request.urlopen(f"{root_url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    keep = ("specpack_requests_total", "specpack_requests_cancelled_total", "specpack_generated_tokens_total",
            "specpack_draft_tokens_proposed_total", "specpack_draft_tokens_accepted_total",
            "specpack_batch_rows")
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(keep)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pack", type=Path)
    parser.add_argument("--prompts", nargs=2, metavar=("FILE", "LIMIT"), action="append", required=True,
                        help="a prompt file and how many prompts to take per category of it")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--cancel", type=int, default=30, help="streaming requests closed mid-way by their client")
    parser.add_argument("--sampled-every", type=int, default=5, help="every Nth request samples (temperature 0.7)")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--max-batch", type=int, default=1, help="the server's --max-batch (docs/batching.md)")
    parser.add_argument("--k", default="auto", help="the server's --k (0: the target alone, speculation off)")
    parser.add_argument("--device", default="cpu", help="the server's --device (cuda: bench/device/serve_load_gpu.sh)")
    parser.add_argument("--cancel-max-tokens", type=int, default=64, help="max_tokens of the cancelled streams")
    parser.add_argument("--cancel-after", type=int, default=2, help="text chunks a cancelled stream reads first")
    parser.add_argument("--max-prompt-chars", type=int, default=None, help="cut each prompt to this many characters")
    parser.add_argument("--time-limit", type=float, default=3600.0, help="seconds; no request starts after it")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "serve_load_cpu.json")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the server (below) when stopped ourselves

    prompts = [p for path, limit in args.prompts for p in read_prompts([path], limit=int(limit))]
    if args.max_prompt_chars:
        prompts = [replace(p, text=p.text[: args.max_prompt_chars]) for p in prompts]
    budget = Budget(args.max_tokens, args.cancel_max_tokens, args.cancel_after)
    planned = plan(prompts, args.requests, args.cancel, args.sampled_every)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root_url = f"http://127.0.0.1:{port}"
    base_url = f"{root_url}/v1"
    log = Path(tempfile.gettempdir()) / "specpack-serve-load.log"
    proc = start_server(args.pack, port, log, max_queue=args.clients * 2, max_batch=args.max_batch, k=args.k,
                        device=args.device)
    try:
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=10) as probe:
            wait_ready(probe, proc, timeout=600)
        server = psutil.Process(proc.pid)
        rss_idle = server.memory_info().rss
        work: queue.Queue[Planned] = queue.Queue()
        for p in planned:
            work.put(p)
        run = Run()
        t0 = time.monotonic()
        threads = [threading.Thread(target=client_loop, args=(base_url, "pair", work, run, budget,
                                                               t0 + args.time_limit, server), daemon=True)
                   for _ in range(args.clients)]
        for t in threads:
            t.start()
        interrupted = False
        try:
            for t in threads:
                t.join()
        except SystemExit:  # SIGTERM (e.g. the time limit of a locked run): keep what finished, say so
            interrupted = True
        with run.lock:
            run.stop.set()
            outcomes = list(run.outcomes)
        wall_s = time.monotonic() - t0
        metrics = scrape(root_url)
    finally:
        proc.send_signal(signal.SIGTERM)
        exit_code = proc.wait(timeout=120)
    summary = {"interrupted": interrupted, **summarize(outcomes, wall_s, len(planned))}
    result = {
        "machine": {**machine_info(None), "shared": True}, "date": time.strftime("%Y-%m-%d"),
        "pack": str(args.pack), "prompts": {Path(path).name: int(limit) for path, limit in args.prompts}, "settings": {
            "requests": args.requests, "clients": args.clients, "cancel": args.cancel, **asdict(budget),
            "max_prompt_chars": args.max_prompt_chars, "sampled_every": args.sampled_every,
            "time_limit_s": args.time_limit, "max_batch": args.max_batch, "k": args.k, "device": args.device},
        "summary": summary, "rss_idle_bytes": rss_idle, "server_log": str(log), "server_metrics": metrics,
        "server_exit_code": exit_code,
        "requests": [{k: v for k, v in asdict(o).items() if k != "text"} for o in
                     sorted(outcomes, key=lambda o: o.index)],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
