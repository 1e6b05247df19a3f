"""What a new user meets after the demo (issue 27): every command listed, the pack's load said aloud, the
baseline beside the speculative run, and the Python API's conveniences (a context manager, the error type at the
top level, statistics as attributes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import specpack
from specpack.cli.main import cli


@pytest.fixture(scope="module")
def pack(tiny_pack) -> Path:
    return tiny_pack("qwen2", "noisy")[0]


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name, command in cli.commands.items():
        assert re.search(rf"^  {name}\b", result.output, re.M), (name, result.output)
        first_line = (command.help or "").split("\n")[0]
        assert first_line, f"{name} has no help"
    summary = result.output.split("Options:")[0]
    assert all(name in summary for name in cli.commands), summary  # the group's own line names them all too


def test_generate_says_when_it_loads_the_pack_and_how_long_it_took(pack: Path) -> None:
    result = CliRunner().invoke(cli, ["generate", str(pack), "--prompt", "def add(a, b):", "--max-new-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert f"[specpack] loading {pack} (checking its files, opening the target) ..." in result.stderr
    assert re.search(r"\[specpack\] loaded in \d+\.\d s \(the draft too\)", result.stderr)  # opened with the pack
    k0 = CliRunner().invoke(cli, ["generate", str(pack), "--prompt", "def add(a, b):", "--max-new-tokens", "4",
                                  "--k", "0"])
    assert k0.exit_code == 0 and re.search(r"\[specpack\] loaded in \d+\.\d s\n", k0.stderr), k0.stderr  # no draft
    assert "loading" not in result.stdout  # the completion alone on stdout


def test_generate_json_stays_one_object_with_the_load_time_apart_from_ttft(pack: Path) -> None:
    result = CliRunner().invoke(cli, ["generate", str(pack), "--prompt", "def add(a, b):", "--max-new-tokens", "4",
                                      "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)["stats"]  # stdout and stderr together: still exactly one JSON object
    assert stats["load_s"] > 0 and "ttft_s" in stats


def test_compare_prints_the_baseline_beside_the_speculative_run(pack: Path) -> None:
    result = CliRunner().invoke(cli, ["compare", str(pack), "--prompt", "def add(a, b):", "--max-new-tokens", "12",
                                      "--k", "4"])
    assert result.exit_code == 0, result.output
    err = result.stderr
    assert "1/2 the target alone (k 0)" in err and "2/2 speculative decoding (k 4)" in err
    assert re.search(r"decode tokens/s +\d+\.\d +\d+\.\d  \(\d+\.\d\dx\)", err), err
    assert "alpha / tau" in err and "same tokens as the target alone: yes" in err  # greedy: the target's own tokens
    assert result.stdout.strip()  # the speculative completion, streamed


def test_compare_checks_its_options_before_loading(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["compare", str(tmp_path / "no-pack"), "--prompt", "x", "--max-new-tokens", "0"])
    assert result.exit_code == 2 and "max_new_tokens" in result.output and "no pack at" not in result.output


def test_the_python_api_of_the_readme(pack: Path) -> None:
    assert specpack.SpecpackError is specpack.errors.SpecpackError
    with specpack.load(pack, threads=1) as loaded:
        out = loaded.generate("def add(a, b):", 8, k=4)
        assert out.stats.alpha == out.stats["alpha"] and out.stats.tau >= 1.0
        assert json.loads(json.dumps(out.stats)) == dict(out.stats)  # still a JSON-serializable dict
        with pytest.raises(AttributeError, match="no statistic 'nope'; there are: accepted"):
            _ = out.stats.nope
    assert loaded.closed
    with pytest.raises(specpack.SpecpackError, match="is closed"):
        loaded.generate("def add(a, b):", 8)


def test_inspect_piped_never_cuts_a_path(pack: Path) -> None:
    """Piped (not a terminal), rich would fit 80 columns and end long cells in an ellipsis: sources are whole."""
    from specpack.contract.manifest import Manifest

    manifest = Manifest.read(pack)
    result = CliRunner().invoke(cli, ["inspect", str(pack)])
    assert result.exit_code == 0, result.output
    sources = [entry.source.source for _, entry in manifest.models()]
    assert any(len(s) > 40 for s in sources), sources  # long enough that 80 columns would have cut it
    for source in sources:
        assert source in result.output, (source, result.output)
    assert "…" not in result.output
