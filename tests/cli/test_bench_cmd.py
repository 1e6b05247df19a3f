"""`specpack bench`: --json and --plot are checked before the benchmark runs (its results are never lost)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from specpack.cli.bench_cmd import bench_command


@pytest.fixture
def prompts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the benchmark ran before its outputs were checked")

    monkeypatch.setattr("specpack.bench.runner.run_bench", never)
    path = tmp_path / "p.txt"
    path.write_text("hello\n")
    return path


@pytest.mark.parametrize(("option", "name", "fragment"), [
    ("--json", "", "an empty path"),
    ("--json", "folder", "is a directory"),
    ("--json", "taken.json", "already exists"),
    ("--json", "a-file/report.json", "is a file, not a directory"),
    ("--plot", "x.xyz", "unknown file type"),
    ("--plot", "taken.json", "unknown file type"),
])
def test_outputs_are_refused_before_the_run(prompts: Path, option: str, name: str, fragment: str) -> None:
    folder = prompts.parent
    (folder / "folder").mkdir()
    (folder / "taken.json").write_text("{}")
    (folder / "a-file").write_text("")
    target = str(folder / name) if name else ""
    result = CliRunner().invoke(bench_command, ["pack", "--prompts", str(prompts), "--k", "1", option, target])
    assert result.exit_code == 2 and fragment in result.output and "Traceback" not in result.output, result.output
    assert (folder / "taken.json").read_text() == "{}"


def test_a_fixed_tree_with_a_fixed_k_is_refused_before_the_run(prompts: Path) -> None:
    result = CliRunner().invoke(bench_command, ["pack", "--prompts", str(prompts), "--k", "1,auto", "--tree", "8"])
    assert result.exit_code == 2 and "--tree N and a fixed --k both fix" in result.output, result.output
    result = CliRunner().invoke(bench_command, ["pack", "--prompts", str(prompts), "--tree", "65"])
    assert result.exit_code == 2 and "1..64" in result.output, result.output


def test_help_documents_the_prompt_file_formats() -> None:
    result = CliRunner().invoke(bench_command, ["--help"], terminal_width=80)
    text = " ".join(result.output.split())
    for fragment in ("{question_id, category, turns}", "{task_id, prompt}", "{question, answer}",
                     "one prompt a line", "specpack fetch --prompts SET", "--repeat"):
        assert fragment in text, fragment
