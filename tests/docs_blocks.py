"""The code blocks of README.md and docs/*.md, and the shell commands in them, for tests/test_readme.py.

A block runs as written unless an HTML comment on the line above it says otherwise, with the reason:

    <!-- docs-test: skip (REASON) -->        not run, not checked (a sketch, a synopsis, a client of a running server)
    <!-- docs-test: check-only (REASON) -->  shell: each command checked (the program, script, make target and every
                                             option exist), none run (needs the real models, a GPU, TensorRT, the net)
    <!-- docs-test: slow (REASON) -->        runs, in the `slow` set (more than a few seconds on the tiny pack)

Fences without a language (diagrams, output) are text, never run.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MODES = ("run", "skip", "check-only", "slow")
_MARK = re.compile(r"<!-- docs-test: (?P<mode>[a-z-]+) \((?P<why>[^)]*)\) -->")
_FENCE = re.compile(r"^```(?P<lang>[a-z]+)\n(?P<code>.*?)^```$", re.S | re.M)
_HEREDOC = re.compile(r"<<-?\s*['\"]?(?P<word>[A-Za-z_]+)['\"]?")
_SEPARATORS = {";", "&&", "||", "|", "&"}
SPECPACK = ("specpack", ".venv/bin/specpack")
SPEC_EXPORT = ("spec-export", ".venv/bin/spec-export")
USER_TOOLS = {"curl", "sha256sum", "pip", "cd", "export", "echo"}  # what a reader has; CI need not


@dataclass(frozen=True)
class Block:
    path: Path
    line: int        # of the opening fence, 1-based
    lang: str        # "python", "bash"
    code: str
    mode: str        # one of MODES
    why: str | None  # the reason a block is not simply run

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(paths: list[Path] = DOCS) -> list[Block]:
    out = []
    for path in paths:
        text = path.read_text()
        for m in _FENCE.finditer(text):
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = _MARK.fullmatch(before.strip())
            out.append(Block(path, text.count("\n", 0, m.start()) + 1, m["lang"], m["code"],
                             mark["mode"] if mark else "run", mark["why"] if mark else None))
    return out


def commands(code: str) -> list[list[str]]:
    """The shell commands of a block as words: comments and here-document bodies dropped, continuation lines joined,
    split at newlines (outside quotes), ;, &&, || and |; redirections dropped."""
    lines, body_end = [], None
    for line in code.splitlines():
        if body_end is not None:
            body_end = None if line.strip() == body_end else body_end
            continue
        if m := _HEREDOC.search(line):
            body_end = m["word"]
            line = line[:m.start()] + line[m.end():]
        lines.append(line)
    lex = shlex.shlex(_newlines_to_separators("\n".join(lines)), posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    out: list[list[str]] = [[]]
    words = iter(lex)
    for word in words:
        if word in _SEPARATORS:
            out.append([])
        elif word in (">", ">>", "<", "2>"):
            next(words, None)  # the redirection's file
        else:
            out[-1].append(word)
    return [c for c in out if c]


def _newlines_to_separators(text: str) -> str:
    """Backslash-newline -> space; a newline outside quotes -> ' ; '; comments (# at a word's start) dropped."""
    out, quote, i = [], None, 0
    while i < len(text):
        ch = text[i]
        if quote:
            quote = None if ch == quote else quote
        elif ch == "\\" and text[i + 1:i + 2] == "\n":
            ch, i = " ", i + 1
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t\n"):
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        elif ch == "\n":
            ch = " ; "
        out.append(ch)
        i += 1
    return "".join(out)


def program(words: list[str]) -> list[str]:
    """The command without its leading variable assignments (`PACK=... specpack ...`)."""
    i = 0
    while i < len(words) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[i]):
        i += 1
    return words[i:]


def problem(words: list[str], cli: click.Group) -> str | None:
    """Why the command could not run as written here (an unknown program, command, option, target or file), or None."""
    words = program(words)
    if not words:
        return None
    prog, args = words[0], words[1:]
    if prog in SPECPACK or prog in SPEC_EXPORT:
        return click_problem(prog, args, cli)
    if prog == "make":
        targets = set(re.findall(r"^([A-Za-z0-9_-]+):", (ROOT / "Makefile").read_text(), re.M))
        missing = [t for t in args if not t.startswith("-") and "=" not in t and t not in targets]
        return f"no make target {missing}" if missing else None
    if prog in ("source", "."):
        return None if (ROOT / args[0]).exists() else f"no file {args[0]}"
    if prog in ("python", "python3", "bash") and args and args[0].endswith((".py", ".sh")):
        return None if (ROOT / args[0]).is_file() else f"no script {args[0]}"
    installed = shutil.which(prog) or (Path(sys.executable).parent / prog).is_file()  # on PATH, or in this environment
    return None if prog in USER_TOOLS or installed else f"unknown program {prog!r}"


def click_problem(prog: str, args: list[str], cli: click.Group) -> str | None:
    command: click.Command = cli
    rest = list(args)
    if prog in SPEC_EXPORT:
        command = cli.commands["export"]
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        if name not in command.commands:
            return f"no command `{name}` (known: {', '.join(command.commands)})"
        command = command.commands[name]
    options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    unknown = [w.split("=")[0] for w in rest if w.startswith("--") and w.split("=")[0] not in options]
    return f"{prog} {command.name}: no option {unknown}" if unknown else None
