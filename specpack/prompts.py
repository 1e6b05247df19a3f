"""Benchmark prompt files, recognised by each record's keys (never by the file name).

    {question_id, category, turns}   Spec-Bench, MT-bench  first turn, chat template   category: the record's
    {task_id, prompt}                HumanEval             plain completion            category: "humaneval"
    {question, answer}               GSM8K                 chat template               category: "gsm8k"
    anything else that is not JSON   text, one prompt a line, plain completion        category: the file stem

JSON Lines files may be gzipped (recognised by the gzip magic bytes). A file is read up to PROMPT_SET_BYTES
(64 MiB), and decompressed up to as much.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpack.bounded_read import GZIP_MAGIC, gunzip_bounded, read_bounded
from specpack.errors import SpecpackError
from specpack.limits import PROMPT_SET_BYTES

FORMATS = ("{question_id, category, turns} (Spec-Bench / MT-bench), {task_id, prompt} (HumanEval), "
           "{question, answer} (GSM8K), or a text file with one prompt a line")
# the table above, as `specpack bench --help` shows it (\b: click keeps the lines as they are)
FORMATS_HELP = """\b
Prompt files (--prompts) are recognised by each record's keys, never by the file's name:
  {question_id, category, turns}  Spec-Bench, MT-bench: the first turn, chat template
  {task_id, prompt}               HumanEval: plain completion
  {question, answer}              GSM8K: the question, chat template
  anything else                   a text file: one prompt a line, plain completion
Categories: the record's, humaneval, gsm8k, or the text file's name up to its first dot.
JSON Lines files may be gzipped; other keys are ignored; up to 64 MiB a file. --limit N keeps
the first N prompts of each category of each file. The standard sets: `specpack fetch
--prompts SET` (humaneval, mt-bench, gsm8k, spec-bench), then --prompts SET."""


@dataclass(frozen=True)
class BenchPrompt:
    id: str          # unique within a run: "HumanEval/0", "mt_bench_question/81", "gsm8k/0", "mine/3"
    category: str
    text: str
    chat: bool       # wrap in the chat template (instructions) or complete as is (code, plain text)


def read_prompts(paths: Sequence[str | Path], limit: int | None = None) -> list[BenchPrompt]:
    """All prompts of all files in order; `limit` keeps the first N of each category of each file."""
    if limit is not None and limit < 1:
        raise SpecpackError("invalid --limit", expected="an integer >= 1", found=str(limit))
    prompts: list[BenchPrompt] = []
    for path in paths:
        prompts.extend(_take_per_category(read_prompt_file(Path(path)), limit))
    seen = Counter(p.id for p in prompts)
    if dupes := [i for i, n in seen.items() if n > 1]:
        raise SpecpackError("the same prompt id comes twice", expected="each prompt file given once",
                            found=f"{dupes[:3]}")
    return prompts


def read_prompt_file(path: Path) -> list[BenchPrompt]:
    lines = _read_lines(path)
    stem = path.name.split(".")[0]
    first = next((line for line in lines if line.strip()), None)
    if first is None:
        raise SpecpackError(f"no prompts in {path}", expected="at least one non-empty line", found="an empty file")
    if _json_object(first) is None:  # plain text: one prompt a line
        return [BenchPrompt(f"{stem}/{n}", stem, line, chat=False)
                for n, line in enumerate(lines) if line.strip()]
    return [_from_record(_parse(line, path, n), path, stem, n) for n, line in enumerate(lines) if line.strip()]


def _read_lines(path: Path) -> list[str]:
    """The file's lines: at most PROMPT_SET_BYTES read, and as many decompressed from gzip."""
    raw = read_bounded(path, PROMPT_SET_BYTES, "prompt file")
    if raw.startswith(GZIP_MAGIC):
        raw = gunzip_bounded(raw, PROMPT_SET_BYTES, f"prompt file {path}")
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise SpecpackError(f"cannot read prompt file {path}", expected="a readable UTF-8 file (gzip allowed)",
                            found=f"bytes that are not UTF-8 (at byte {err.start})") from None


def _json_object(line: str) -> dict[str, Any] | None:
    """The line as a JSON object, None when it is not JSON (a text line), SpecpackError when nested too deeply."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    except RecursionError:
        raise SpecpackError("a prompt record is nested too deeply", expected="JSON Lines records a few levels deep",
                            found=f"a line starting {line[:20]!r}") from None
    return value if isinstance(value, dict) else None


def _parse(line: str, path: Path, n: int) -> dict[str, Any]:
    record = _json_object(line)
    if record is None:
        raise SpecpackError(f"{path}, line {n + 1} is not a JSON object", expected="JSON Lines, one object a line",
                            found=line[:80])
    return record


def _from_record(record: dict[str, Any], path: Path, stem: str, n: int) -> BenchPrompt:
    keys = record.keys()
    if {"question_id", "category", "turns"} <= keys:
        turns = record["turns"]
        text = turns[0] if isinstance(turns, list) and turns else None
        return _prompt(f"{stem}/{record['question_id']}", str(record["category"]), text, True, path, n)
    if {"task_id", "prompt"} <= keys:
        return _prompt(str(record["task_id"]), "humaneval", record["prompt"], False, path, n)
    if {"question", "answer"} <= keys:
        return _prompt(f"gsm8k/{n}", "gsm8k", record["question"], True, path, n)
    raise SpecpackError(f"unknown prompt record in {path}, line {n + 1}", expected=FORMATS,
                        found=f"keys {sorted(keys)}")


def _prompt(pid: str, category: str, text: object, chat: bool, path: Path, n: int) -> BenchPrompt:
    if not isinstance(text, str) or not text:
        raise SpecpackError(f"empty prompt in {path}, line {n + 1}", expected="a non-empty string",
                            found=repr(text)[:80])
    return BenchPrompt(pid, category, text, chat)


def _take_per_category(prompts: Iterable[BenchPrompt], limit: int | None) -> list[BenchPrompt]:
    taken: Counter[str] = Counter()
    kept = []
    for p in prompts:
        if limit is None or taken[p.category] < limit:
            taken[p.category] += 1
            kept.append(p)
    return kept
