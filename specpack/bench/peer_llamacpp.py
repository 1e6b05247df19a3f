"""llama.cpp beside specpack: the same GGUF files, prompts, token budget and thread count, in the same run.

    llama-completion          autoregressive decoding of the target           decode tok/s: its "eval time" line
    llama-speculative-simple  the target with the draft (--spec-draft-n-max k)  its "decoded N tokens in T s" line
    llama-speculative         the same, its other speculative driver           likewise

Each tool runs once per prompt, greedy (--temp 0 --top-k 1), in its own process; its peak RSS is the peak
VmHWM read from /proc while it runs (run_tool says why not wait4). Prompts go in as text (-f): plain
completion as is, chat prompts rendered with the pack's chat template (the text carries the special tokens,
which llama.cpp parses). The tools are found in
--llamacpp-dir or $SPECPACK_LLAMACPP (a llama.cpp build/bin); the GGUF files are the manifest's sources.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specpack.bench.memory import peak_rss_kb
from specpack.errors import SpecpackError

if TYPE_CHECKING:
    from specpack.bench.runner import BenchRun

ENV = "SPECPACK_LLAMACPP"
AR, SPEC_SIMPLE, SPEC = "llama-completion", "llama-speculative-simple", "llama-speculative"
TOOLS = (AR, SPEC_SIMPLE, SPEC)
CONTEXT = 2048
POLL_S = 0.02  # how often a running tool's peak RSS is read
# lines as llama.cpp prints them, with or without its log prefix ("0.03.973.279 I common_perf_print:" in the build of
# bench/build_llamacpp.sh, "llama_perf_context_print:" in older ones); "prompt eval time" counts tokens, not runs
_EVAL = re.compile(r"(?<!prompt )\beval time =\s*([\d.]+) ms /\s*(\d+) runs")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_COUNT = re.compile(r"^(?:.*\s)?(n_drafted|n_accept)\s*=\s*(\d+)", re.MULTILINE)


def find_tools(tools_dir: Path | None) -> Path:
    """The directory holding the llama.cpp tools: the option, else $SPECPACK_LLAMACPP; SpecpackError if absent."""
    where = tools_dir or (Path(os.environ[ENV]) if os.environ.get(ENV) else None)
    if where is None:
        raise SpecpackError("--peer llamacpp needs llama.cpp's tools", expected=f"--llamacpp-dir DIR or ${ENV} "
                            f"(a directory holding {', '.join(TOOLS)})", found="neither",
                            hint="build them with ../shared/peers/build-llama-cpp; they land in build/bin")
    missing = [t for t in TOOLS if not (Path(where) / t).is_file()]
    if missing:
        raise SpecpackError("llama.cpp tools missing", expected=f"{', '.join(TOOLS)} in {where}",
                            found=f"missing: {', '.join(missing)}", hint="point --llamacpp-dir at llama.cpp's build/bin")
    return Path(where)


@dataclass(frozen=True)
class ToolRun:
    decoded_tokens: int
    decode_s: float
    peak_rss_mb: float
    wall_s: float
    drafted: int | None = None
    accepted: int | None = None
    text: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.decoded_tokens / self.decode_s if self.decode_s > 0 else 0.0


def run_tool(command: Sequence[str]) -> tuple[str, str, float, float]:
    """(stdout, stderr, peak RSS in MB, wall seconds) of one tool run; SpecpackError when it fails.

    The peak RSS is the tool's own: VmHWM of /proc/PID/status, read every POLL_S while it runs (its memory
    after exec). Not wait4's ru_maxrss: the child is forked (vfork) from this process, and the kernel keeps the
    larger of that image and the tool's, so every tool would report this process's peak instead."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(list(command), stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        peak_kb = 0
        while True:
            peak_kb = max(peak_kb, peak_rss_kb(proc.pid))
            pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(POLL_S)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SpecpackError(f"{Path(command[0]).name} failed", expected="exit status 0",
                            found=f"status {proc.returncode}: {stderr.strip().splitlines()[-1:] or ''}")
    return stdout, stderr, peak_kb / 1024, wall


def parse_ar(stdout: str, stderr: str, rss: float, wall: float) -> ToolRun:
    match = _EVAL.search(stderr)
    if match is None:
        raise SpecpackError("llama-completion printed no eval timing", expected="an 'eval time = ... runs' line",
                            found=stderr.strip()[-300:])
    return ToolRun(int(match.group(2)), float(match.group(1)) / 1e3, rss, wall, text=stdout)


def parse_spec(stdout: str, stderr: str, rss: float, wall: float) -> ToolRun:
    text = stdout + stderr
    match = _DECODED.search(text)
    if match is None:
        raise SpecpackError("llama.cpp's speculative tool printed no timing", expected="a 'decoded N tokens in T "
                            "seconds' line", found=text.strip()[-300:])
    counts = {key: int(value) for key, value in _COUNT.findall(text)}
    return ToolRun(int(match.group(1)), float(match.group(2)), rss, wall, counts.get("n_drafted"), counts.get("n_accept"),
                   text=stdout)


def commands(tools: Path, target: str, draft: str, prompt_file: Path, max_new_tokens: int, k: int,
             threads: int) -> dict[str, list[str]]:
    """The three command lines for one prompt (greedy, the same threads for both models)."""
    common = ["-f", str(prompt_file), "-n", str(max_new_tokens), "--temp", "0", "--top-k", "1", "-c", str(CONTEXT),
              "-t", str(threads), "-tb", str(threads), "--seed", "0"]
    spec = ["-md", draft, "-td", str(threads), "-tbd", str(threads), "--spec-draft-n-max", str(k)]
    return {
        "ar": [str(tools / AR), "-m", target, *common, "-no-cnv", "--no-display-prompt"],
        "speculative_simple": [str(tools / SPEC_SIMPLE), "-m", target, *common, *spec, "--spec-type", "draft-simple"],
        "speculative": [str(tools / SPEC), "-m", target, *common, *spec],
    }


def run_llamacpp_peer(run: BenchRun, tools_dir: Path | None, k: int) -> tuple[dict[str, Any] | None, str | None]:
    """Every prompt of the run through the three tools; per-prompt records and a summary (or a note why not)."""
    target, draft = run.pack["target_source"].get("source", ""), run.pack["draft_source"].get("source", "")
    if not (str(target).lower().endswith(".gguf") and str(draft).lower().endswith(".gguf")):
        return None, "--peer llamacpp skipped: the pack was not exported from GGUF files"
    if not (Path(target).is_file() and Path(draft).is_file()):
        return None, f"--peer llamacpp skipped: the GGUF sources {draft}, {target} are not here"
    if not run.config.greedy:
        return None, "--peer llamacpp skipped: it compares greedy decoding (use --temperature 0)"
    from specpack.runtime.tokenizer import PackTokenizer

    tools = find_tools(tools_dir)
    threads = run.config.threads or os.cpu_count() or 1
    tokenizer = PackTokenizer.load(Path(run.pack["path"]) / "tokenizer") if any(r.prompt.chat for r in run.runs) else None
    records = []
    with tempfile.TemporaryDirectory(prefix="specpack-llamacpp-") as tmp:
        for i, r in enumerate(run.runs):
            prompt_file = Path(tmp) / f"prompt{i}.txt"
            text = r.prompt.text
            if r.prompt.chat and tokenizer is not None:
                text = tokenizer.render_chat([{"role": "user", "content": text}])
            # -f drops one trailing newline from the file: add one, so the tool reads exactly `text`
            prompt_file.write_text(text + "\n" if text.endswith("\n") else text, encoding="utf-8")
            cmds = commands(tools, target, draft, prompt_file, run.config.max_new_tokens, k, threads)
            if i == 0:  # warm-up: the model files into the page cache, as our load is not timed either
                run_tool(cmds["ar"])
            print(f"[bench peer llamacpp] {i + 1}/{len(run.runs)} {r.prompt.id}", flush=True)
            record: dict[str, Any] = {"id": r.prompt.id, "category": r.prompt.category}
            for mode, cmd in cmds.items():
                parse = parse_ar if mode == "ar" else parse_spec
                result = parse(*run_tool(cmd))
                record[mode] = {"decoded_tokens": result.decoded_tokens, "decode_s": result.decode_s,
                                "tokens_per_s": result.tokens_per_s, "peak_rss_mb": result.peak_rss_mb,
                                "wall_s": result.wall_s, "drafted": result.drafted, "accepted": result.accepted}
            records.append(record)
    return {"tools": str(tools), "k": k, "threads": threads, "commands": {m: " ".join(c) for m, c in cmds.items()},
            "prompts": records}, None


def llamacpp_summary(run: BenchRun, raw: dict[str, Any], best: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's decode tok/s (median over prompts, and pooled) and peak RSS beside ours at best_k."""
    records = raw["prompts"]
    ours_spec = [r.spec[best["k"]].stats["tokens_per_s"] for r in run.runs]
    ours_ar = [r.ar.stats["tokens_per_s"] for r in run.runs]
    summary: dict[str, Any] = {"k": raw["k"], "threads": raw["threads"], "tools": raw["tools"],
                               "commands": raw["commands"],
                               "ours": {"spec_tokens_per_s_median": statistics.median(ours_spec),
                                        "ar_tokens_per_s_median": statistics.median(ours_ar)}}
    for mode in ("ar", "speculative_simple", "speculative"):
        rows = [rec[mode] for rec in records]
        tokens, seconds = sum(x["decoded_tokens"] for x in rows), sum(x["decode_s"] for x in rows)
        drafted = sum(x["drafted"] or 0 for x in rows)
        median = statistics.median(x["tokens_per_s"] for x in rows)
        summary[mode] = {"tokens_per_s_median": median, "tokens_per_s": tokens / seconds if seconds else None,
                         "peak_rss_mb": max(x["peak_rss_mb"] for x in rows),
                         "acceptance": sum(x["accepted"] or 0 for x in rows) / drafted if drafted else None,
                         "ours_spec_over_this": statistics.median(ours_spec) / median if median else None}
    summary["prompts"] = records
    return summary
