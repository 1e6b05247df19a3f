"""`specpack bench` end to end on a tiny exported pack: ours vs the target alone, and vs transformers (--peer hf)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from click.testing import CliRunner

from specpack.cli.bench_cmd import bench_command


@pytest.fixture(scope="module")
def tiny_pack(tiny_pairs: Callable[..., tuple[Path, Path]], tmp_path_factory: pytest.TempPathFactory,
              shared_plain_exports: Callable[[], AbstractContextManager[None]]) -> Path:
    pytest.importorskip("specpack.graphs.attach", reason="the exporter's graph builder is not there yet")
    from specpack.export.pipeline import ExportConfig, export_pack

    draft_dir, target_dir = tiny_pairs("qwen2")
    with shared_plain_exports():  # the plain graphs of conftest's tiny_pack("qwen2") (tests/runtime/test_backends.py)
        return export_pack(str(draft_dir), str(target_dir), tmp_path_factory.mktemp("bench") / "pack",
                           ExportConfig(k=4, isolate=False))


def test_bench_on_a_tiny_pack_with_the_hf_peer(tiny_pack: Path, tmp_path: Path) -> None:
    text = tmp_path / "code.txt"
    text.write_text("def add(a, b):\nfor i in range(10):\nimport numpy as np\n")
    spec = tmp_path / "spec.jsonl"
    spec.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["Hello world!"]}) + "\n")
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    result = CliRunner().invoke(bench_command, [
        str(tiny_pack), "--prompts", str(text), "--prompts", str(spec), "--k", "1,4", "--max-new-tokens", "12",
        "--limit", "2", "--threads", "1", "--timing-reps", "3", "--peer", "hf", "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    o = report["overall"]
    assert report["best_k"] in (1, 4) and o["k"] == report["best_k"] and set(report["by_k"]) == {"1", "4"}
    assert set(report["by_category"]) == {"code", "writing"} and o["n_prompts"] == 3
    assert o["identical_fraction"] == 1.0 and o["divergences"] == []  # greedy is lossless
    assert o["c"] > 0 and o["v"] > 0 and o["tokens_per_s"] > 0 and o["ar_tokens_per_s"] > 0
    assert o["predicted_speedup"] == pytest.approx(o["tau"] / (o["k"] * o["c"] + o["v"]))
    hf = report["peers"]["hf"]
    assert hf["same_input_ids_fraction"] == 1.0  # our tokenizer and chat template give transformers' ids
    assert hf["ar_equals_ours_fraction"] == 1.0  # golden: our greedy tokens are transformers' greedy tokens
    assert hf["ours_over_assisted"] > 0 and hf["assisted_tokens_per_s"] > 0
    assert {"load", "autoregressive", "speculative"} <= set(report["peak_memory"]["peak_rss_mb"])
    assert png.stat().st_size > 10_000


def test_bench_imports_no_torch_in_this_process() -> None:
    code = ("import sys, specpack.cli.bench_cmd, specpack.bench.runner, specpack.bench.report, specpack.bench.peer_hf;"
            "print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
