"""The prompt files shipped in bench/prompts/ (our own writing; docs/prompts.md): they parse as `make bench` reads
them, and `make bench`'s command runs on a tiny pack as the Makefile writes it (only the pack and the sizes differ)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from specpack.cli.main import cli
from specpack.prompts import read_prompts

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [ROOT / "bench" / "prompts" / "code.txt", ROOT / "bench" / "prompts" / "chat.jsonl"]


def test_the_shipped_prompts_parse() -> None:
    prompts = read_prompts(SHIPPED)
    assert len(prompts) == 12 and {p.category for p in prompts} == {"code", "coding", "explain"}
    assert all(not p.chat for p in prompts[:8]) and all(p.chat for p in prompts[8:])
    assert len(read_prompts(SHIPPED, limit=2)) == 6  # `make bench`'s --limit 2: two of each category


def _make_bench_args() -> list[str]:
    """The arguments of `specpack bench` in the Makefile's bench target, continuation lines joined."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    line = re.search(r"^bench: .*\n\t\$\(VENV\)/bin/specpack bench (.*)$", text, re.M)
    assert line is not None, "the Makefile's bench target runs specpack bench"
    return shlex.split(line.group(1))


def test_make_bench_runs_on_a_tiny_pack(tiny_pack, tmp_path: Path) -> None:
    args = _make_bench_args()
    assert args[0] == "$(DEMO_PACK)" and "--prompts" in args
    pack = tiny_pack("qwen2", "noisy", k=4)[0]
    args = [str(pack), *(str(ROOT / a) if a.startswith("bench/prompts/") else a for a in args[1:])]
    args[args.index("--max-new-tokens") + 1] = "8"  # smaller, for the tiny pack
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(cli, ["bench", *args, "--threads", "1", "--timing-reps", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert set(report["by_category"]) == {"code", "coding", "explain"} and report["overall"]["identical_fraction"] == 1.0
