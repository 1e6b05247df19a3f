"""The README's examples run as written (issue 27): each Python block, on a tiny pack, with only the pack's path
substituted; a block that needs what CI lacks says so in a `<!-- docs-test: skip (reason) -->` line above it. And the
command synopsis in docs/reference.md names every option each command has."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import click
import pytest

from specpack.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
DEMO_PACK = "~/.cache/specpack/packs/qwen2.5-coder-int4"  # the Makefile's DEMO_PACK, as the README writes it
BLOCK = re.compile(r"(?:<!-- docs-test: skip \((?P<why>[^)]+)\) -->\n)?```python\n(?P<code>.*?)```", re.S)


def python_blocks(path: Path) -> list[tuple[str, str | None]]:
    return [(m["code"], m["why"]) for m in BLOCK.finditer(path.read_text())]


def test_the_readme_has_python_examples_and_says_why_any_is_skipped() -> None:
    blocks = python_blocks(ROOT / "README.md")
    assert sum(why is None for _, why in blocks) >= 1
    assert all(why is None or why.strip() for _, why in blocks)


def test_the_demo_pack_path_is_the_makefiles() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "DEMO_PACK ?= $(SPECPACK_CACHE)/packs/" + DEMO_PACK.rsplit("/", 1)[1] in makefile


@pytest.mark.parametrize("index", range(len(python_blocks(ROOT / "README.md"))))
def test_readme_python_example_runs_as_written(index: int, tiny_pack) -> None:
    code, why = python_blocks(ROOT / "README.md")[index]
    if why is not None:
        pytest.skip(why)
    pack = tiny_pack("qwen2", "noisy", k=4)[0]
    assert DEMO_PACK in code, "the example names the demo pack, which the test replaces"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.replace(DEMO_PACK, str(pack)), f"README.md python block {index}", "exec"), {"__name__": "readme"})
    assert printed.getvalue().strip()


def _synopsis(command: str) -> str:
    """docs/reference.md's synopsis lines of `specpack COMMAND` (with their continuation lines)."""
    text = (ROOT / "docs" / "reference.md").read_text()
    block = text[text.index("## Command line"):]
    block = block[block.index("```bash\n"):block.index("```\n", block.index("```bash\n") + 8)]
    lines, taking = [], False
    for line in block.splitlines():
        if line.startswith(("specpack ", "spec-export ")):
            taking = line.startswith(f"specpack {command} ") or (command == "export" and line.startswith("spec-export "))
        if taking:
            lines.append(line)
    return "\n".join(lines)


def _commands() -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []
    for name, command in cli.commands.items():
        if isinstance(command, click.Group):
            out += [(f"{name} {sub}", c) for sub, c in command.commands.items()]
        else:
            out.append((name, command))
    return out


@pytest.mark.parametrize(("name", "command"), _commands(), ids=[n for n, _ in _commands()])
def test_the_reference_synopsis_names_every_option(name: str, command: click.Command) -> None:
    synopsis = _synopsis(name)
    assert synopsis, f"no synopsis line for specpack {name}"
    options = [o for p in command.params if isinstance(p, click.Option) for o in p.opts
               if o.startswith("--") and o not in ("--help", "--debug")]
    missing = [o for o in options if not re.search(re.escape(o) + r"\b", synopsis)]
    assert not missing, f"specpack {name}: {missing} not in docs/reference.md's synopsis:\n{synopsis}"
