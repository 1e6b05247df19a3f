"""The README's and the docs' code blocks run as written (issue 27), on a tiny pack, with only the pack's path
substituted: Python blocks are executed, and the `specpack` commands of shell blocks run in-process (every other
command is checked: its program, script or make target exists); a block that needs what CI lacks (the real models,
a GPU, TensorRT, a running server, the network) says so on the line above it and is only checked, or skipped
(tests/docs_blocks.py has the marks). And the command synopsis in docs/reference.md names every option each command
has, and only options it has."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from docs_blocks import MODES, ROOT, SPEC_EXPORT, SPECPACK, Block, blocks, commands, problem, program

from specpack.cli.main import cli

DEMO_PACK = "~/.cache/specpack/packs/qwen2.5-coder-int4"  # the Makefile's DEMO_PACK, as the README writes it
PACK_WORDS = ("$PACK", "PACK", DEMO_PACK)                 # how the docs name a pack in commands
BLOCKS = [b for b in blocks() if b.lang in ("python", "bash")]


def _param(block: Block) -> object:
    return pytest.param(block, id=block.id, marks=[pytest.mark.slow] if block.mode == "slow" else [])


def test_every_block_is_runnable_or_says_why_not() -> None:
    unknown = [b.id for b in blocks() if b.mode not in MODES or (b.mode != "run" and not (b.why or "").strip())]
    assert not unknown, f"marks without a known mode or a reason: {unknown}"
    assert not [b.id for b in blocks() if b.lang not in ("python", "bash")], "fences are python, bash or plain text"
    readme = [b for b in BLOCKS if b.path.name == "README.md"]
    assert any(b.lang == "python" and b.mode == "run" for b in readme)
    assert any(b.lang == "bash" and b.mode == "run" for b in readme)


def test_the_demo_pack_path_is_the_makefiles() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "DEMO_PACK ?= $(SPECPACK_CACHE)/packs/" + DEMO_PACK.rsplit("/", 1)[1] in makefile


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS if b.lang == "python"])
def test_python_block_runs_as_written(block: Block, tiny_pack) -> None:
    if block.mode in ("skip", "check-only"):
        pytest.skip(block.why or "")
    pack = tiny_pack("qwen2", "noisy", k=4)[0]
    assert DEMO_PACK in block.code, "the example names the demo pack, which the test replaces"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block.code.replace(DEMO_PACK, str(pack)), block.id, "exec"), {"__name__": "readme"})
    assert printed.getvalue().strip()


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS if b.lang == "bash" and b.mode != "skip"])
def test_shell_block_names_only_what_exists(block: Block) -> None:
    found = [(" ".join(c), why) for c in commands(block.code) if (why := problem(c, cli))]
    assert not found, f"{block.id}: {found}"


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS if b.lang == "bash" and b.mode in ("run", "slow")])
def test_shell_block_runs_as_written(block: Block, tiny_pack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its specpack commands, in a fresh folder that sees the repository's bench/ (the shipped prompt files)."""
    pack = str(tiny_pack("qwen2", "noisy", k=4)[0])
    os.symlink(ROOT / "bench", tmp_path / "bench")
    monkeypatch.chdir(tmp_path)
    ran = 0
    for words in map(program, commands(block.code)):
        if words and words[0] in (*SPECPACK, *SPEC_EXPORT):
            args = [pack if w in PACK_WORDS else w for w in words[1:]]
            group = ["export"] if words[0] in SPEC_EXPORT else []
            result = CliRunner().invoke(cli, [*group, *args])
            assert result.exit_code == 0, f"{block.id}: {' '.join(words)}\n{result.output}"
            ran += 1
    assert ran or not any(w and w[0] in (*SPECPACK, *SPEC_EXPORT) for w in map(program, commands(block.code)))


def test_the_docs_test_reads_shell_as_a_shell_would() -> None:
    code = """source .venv/bin/activate    # a comment
PACK=~/p specpack inspect $PACK && echo 'a # b' \\
  | sha256sum -c <<'SUMS'
abc  x
SUMS
curl -d '{
  "a": 1}' http://x > out.json
"""
    assert commands(code) == [["source", ".venv/bin/activate"], ["PACK=~/p", "specpack", "inspect", "$PACK"],
                              ["echo", "a # b"], ["sha256sum", "-c"], ["curl", "-d", '{\n  "a": 1}', "http://x"]]
    assert problem(["specpack", "bench", "P", "--repeat", "3"], cli) is None
    assert "no option ['--repaet']" in (problem(["specpack", "bench", "P", "--repaet", "3"], cli) or "")
    assert "no command `benchh`" in (problem(["specpack", "benchh"], cli) or "")
    assert "no make target ['dmeo']" in (problem(["make", "dmeo"], cli) or "")


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
    has = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    extra = sorted({o for o in re.findall(r"--[a-z0-9-]+", synopsis) if o not in has})
    if name != "export":  # spec-export's lines also name the other commands' options (distill)
        assert not extra, f"docs/reference.md's synopsis of specpack {name} names {extra}, which it does not have"
