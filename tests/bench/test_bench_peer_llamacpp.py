"""The llama.cpp peer's plumbing with stand-in tools (shell scripts that print what llama.cpp prints): command
lines, parsing, per-prompt records, medians and ratios. The real tools run in bench/ (bench/README.md)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from bench_fakes import make_run, prompt_run, stats

from specpack.bench import peer_llamacpp
from specpack.bench.peer_llamacpp import find_tools, llamacpp_summary, parse_ar, parse_spec, run_llamacpp_peer
from specpack.bench.runner import Decode
from specpack.errors import SpecpackError

AR_LINE = ("llama_perf_context_print:        eval time =     500.00 ms /    63 runs   (    7.94 ms per token,   "
           "126.00 tokens per second)")
PROMPT_LINE = "llama_perf_context_print: prompt eval time =      90.00 ms /    12 tokens"
SPEC_LINES = ("decoded   64 tokens in    {s} seconds, speed:   1 t/s\nn_draft   = 4\nn_drafted = 40\nn_accept  = 30\n"
              "accept    = 75.000%")


def _tool(directory: Path, name: str, stderr: str) -> None:
    script = directory / name
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {directory}/calls.txt\necho ' generated'\ncat >&2 <<'END'\n{stderr}\nEND\n"
                      "sleep 0.1\n")  # long enough for its peak RSS to be read
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    _tool(tmp_path, peer_llamacpp.AR, f"{PROMPT_LINE}\n{AR_LINE}")
    _tool(tmp_path, peer_llamacpp.SPEC_SIMPLE, SPEC_LINES.format(s="2.000"))
    _tool(tmp_path, peer_llamacpp.SPEC, SPEC_LINES.format(s="1.000"))
    return tmp_path


def test_parsers() -> None:
    ar = parse_ar("text", f"{PROMPT_LINE}\n{AR_LINE}", 1500.0, 3.0)
    assert (ar.decoded_tokens, ar.decode_s, ar.tokens_per_s) == (63, 0.5, 126.0)
    spec = parse_spec("", SPEC_LINES.format(s="2.000"), 2000.0, 4.0)
    assert (spec.decoded_tokens, spec.decode_s, spec.drafted, spec.accepted) == (64, 2.0, 40, 30)
    # the same lines with the log prefix of newer builds (timestamp, level, function), as bench/build_llamacpp.sh's
    prefixed = "\n".join(f"0.03.973.279 I common_perf_print: {line.split(': ', 1)[1]}" for line in (PROMPT_LINE, AR_LINE))
    assert parse_ar("", prefixed, 0.0, 0.0).decoded_tokens == 63
    spec = parse_spec("", "\n".join(f"0.06.524.949 I {line}" for line in SPEC_LINES.format(s="2.000").splitlines()), 0.0, 0.0)
    assert (spec.decoded_tokens, spec.drafted, spec.accepted) == (64, 40, 30)
    with pytest.raises(SpecpackError, match="no eval timing"):
        parse_ar("", PROMPT_LINE, 0.0, 0.0)  # the prompt line alone is not the decode timing
    with pytest.raises(SpecpackError, match="no timing"):
        parse_spec("", "n_drafted = 3", 0.0, 0.0)


def test_peak_rss_is_the_tools_own(tmp_path: Path) -> None:
    """The tool's peak resident memory, not this (larger) process's: a child forked from a big process inherits
    that image's high-water mark in wait4's ru_maxrss."""
    import sys

    from specpack.bench.peer_llamacpp import run_tool

    ballast = bytearray(300 * 1024 * 1024)  # this process: at least 300 MB resident
    ballast[:: 4096] = b"x" * len(ballast[:: 4096])
    tool = tmp_path / "tool.py"
    tool.write_text("import time\nb = bytearray(40 * 1024 * 1024)\nb[::4096] = b'y' * len(b[::4096])\ntime.sleep(0.5)\n")
    _, _, peak_mb, _ = run_tool([sys.executable, str(tool)])
    assert 40 <= peak_mb < 200, peak_mb
    del ballast


def test_tools_are_found_by_option_or_environment(tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(peer_llamacpp.ENV, raising=False)
    with pytest.raises(SpecpackError, match=r"needs llama\.cpp's tools"):
        find_tools(None)
    assert find_tools(tools) == tools
    monkeypatch.setenv(peer_llamacpp.ENV, str(tools))
    assert find_tools(None) == tools
    (tools / peer_llamacpp.SPEC).unlink()
    with pytest.raises(SpecpackError, match="found:    missing: llama-speculative\n"):
        find_tools(tools)


def test_runs_each_prompt_through_the_three_tools(tools: Path, tmp_path: Path) -> None:
    runs = [prompt_run(f"p{i}", "code", Decode([1] * 9, stats(0, steps=8, accepted=0, new_tokens=9, decode_s=1.0)),
                       {4: Decode([1] * 9, stats(4, steps=2, accepted=6, new_tokens=9, decode_s=0.1 * (i + 1)))})
            for i in range(3)]
    run = make_run(runs, (4,))
    for role in ("draft", "target"):
        (tmp_path / f"{role}.gguf").write_bytes(b"GGUF")
        run.pack[f"{role}_source"] = {"source": str(tmp_path / f"{role}.gguf")}
    raw, note = run_llamacpp_peer(run, tools, k=4)
    assert note is None and raw is not None
    calls = (tools / "calls.txt").read_text().splitlines()
    assert len(calls) == 1 + 3 * 3  # a warm-up, then three tools a prompt
    assert all("--temp 0 --top-k 1" in c and "-t 1" not in c for c in calls)
    assert sum("--spec-draft-n-max 4" in c and "-md " in c for c in calls) == 6
    summary = llamacpp_summary(run, raw, {"k": 4})
    assert summary["ar"]["tokens_per_s_median"] == 126.0 and summary["speculative"]["tokens_per_s_median"] == 64.0
    assert summary["speculative_simple"]["acceptance"] == 0.75
    assert summary["ours"]["spec_tokens_per_s_median"] == pytest.approx(40.0)  # 8 tokens in 0.2 s
    assert summary["ar"]["ours_spec_over_this"] == pytest.approx(40.0 / 126.0)
    assert summary["ar"]["peak_rss_mb"] > 0


def test_not_a_gguf_pack_is_a_note(tools: Path) -> None:
    run = make_run([prompt_run("p", "code", Decode([1], stats(0, steps=0, accepted=0, new_tokens=1, decode_s=1.0)),
                                {})], (4,))
    run.pack["target_source"] = run.pack["draft_source"] = {"source": "Qwen/Qwen2.5-0.5B"}
    raw, note = run_llamacpp_peer(run, tools, k=4)
    assert raw is None and note is not None and "not exported from GGUF files" in note
