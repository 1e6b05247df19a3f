"""Prompt files: each format recognised by its keys (not the name), gzip, text, --limit, clear errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from specpack.errors import SpecpackError
from specpack.prompts import read_prompt_file, read_prompts


def _jsonl(path: Path, records: list[dict[str, object]], gz: bool = False) -> Path:
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_spec_bench_first_turn_chat_and_category(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "questions.txt", [  # the name says text; the keys say Spec-Bench
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
        {"question_id": 82, "category": "math", "turns": ["What is 2+2?"]}])
    prompts = read_prompt_file(f)
    assert [(p.id, p.category, p.text, p.chat) for p in prompts] == [
        ("questions/81", "writing", "Write a poem.", True), ("questions/82", "math", "What is 2+2?", True)]


@pytest.mark.parametrize("gz", [False, True])
def test_humaneval_plain_completion_plain_or_gzipped(tmp_path: Path, gz: bool) -> None:
    f = _jsonl(tmp_path / ("he.jsonl.gz" if gz else "he.jsonl"), [
        {"task_id": "HumanEval/0", "prompt": "def f(x):\n", "entry_point": "f", "test": ""},
        {"task_id": "HumanEval/1", "prompt": "def g():\n"}], gz=gz)
    prompts = read_prompt_file(f)
    assert [(p.id, p.category, p.text, p.chat) for p in prompts] == [
        ("HumanEval/0", "humaneval", "def f(x):\n", False), ("HumanEval/1", "humaneval", "def g():\n", False)]


def test_gzip_is_recognised_by_content_not_name(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "data.jsonl", [{"question": "How many?", "answer": "#### 3"}], gz=True)
    [p] = read_prompt_file(f)
    assert (p.id, p.category, p.text, p.chat) == ("gsm8k/0", "gsm8k", "How many?", True)


def test_text_file_one_prompt_a_line(tmp_path: Path) -> None:
    f = tmp_path / "mine.prompts.txt"
    f.write_text("first prompt\n\nsecond {not json}\n")
    prompts = read_prompt_file(f)
    assert [(p.id, p.category, p.text, p.chat) for p in prompts] == [
        ("mine/0", "mine", "first prompt", False), ("mine/2", "mine", "second {not json}", False)]


def test_limit_takes_first_n_of_each_category_of_each_file(tmp_path: Path) -> None:
    records = [{"question_id": i, "category": "ab"[i % 2], "turns": [f"q{i}"]} for i in range(10)]
    spec = _jsonl(tmp_path / "spec.jsonl", records)
    gsm = _jsonl(tmp_path / "gsm.jsonl", [{"question": f"g{i}", "answer": ""} for i in range(5)])
    prompts = read_prompts([spec, gsm], limit=2)
    assert [p.text for p in prompts] == ["q0", "q1", "q2", "q3", "g0", "g1"]
    assert len(read_prompts([spec, gsm])) == 15


def test_unknown_record_names_keys_and_formats(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "x.jsonl", [{"instruction": "do it", "output": "done"}])
    with pytest.raises(SpecpackError) as err:
        read_prompt_file(f)
    message = str(err.value)
    assert "unknown prompt record" in message and "['instruction', 'output']" in message
    assert "{task_id, prompt} (HumanEval)" in message and "{question_id, category, turns}" in message


@pytest.mark.parametrize(("content", "what"), [
    ("", "no prompts"),
    ('{"task_id": "a", "prompt": "x"}\nnot json\n', "line 2 is not a JSON object"),
    ('{"question_id": 1, "category": "c", "turns": []}\n', "empty prompt"),
])
def test_bad_files(tmp_path: Path, content: str, what: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(SpecpackError, match=what):
        read_prompt_file(f)


def test_errors_for_missing_file_bad_limit_and_duplicates(tmp_path: Path) -> None:
    with pytest.raises(SpecpackError, match="cannot read prompt file"):
        read_prompts([tmp_path / "nope.jsonl"])
    f = _jsonl(tmp_path / "he.jsonl", [{"task_id": "T/0", "prompt": "x"}])
    with pytest.raises(SpecpackError, match="invalid --limit"):
        read_prompts([f], limit=0)
    with pytest.raises(SpecpackError, match="the same prompt id comes twice"):
        read_prompts([f, f])


def test_deeply_nested_record_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "deep.jsonl"
    f.write_text('{"task_id": "a", "prompt": "x"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(SpecpackError, match="nested too deeply"):
        read_prompt_file(f)
    f.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(SpecpackError, match="nested too deeply"):
        read_prompt_file(f)


def test_corrupt_and_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress(b'{"task_id": "a", "prompt": "x"}\n')
    for bad in (data[:-12], data[:10] + bytes(b ^ 0xFF for b in data[10:-8]) + data[-8:]):
        f = tmp_path / "bad.jsonl.gz"
        f.write_bytes(bad)
        with pytest.raises(SpecpackError, match="not valid gzip data"):
            read_prompt_file(f)


def test_files_are_read_and_decompressed_up_to_a_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("specpack.prompts.PROMPT_SET_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.jsonl.gz"
    bomb.write_bytes(gzip.compress(b"x" * (8 << 20)))  # 8 KB that inflate to 8 MiB
    with pytest.raises(SpecpackError, match="too large once decompressed"):
        read_prompt_file(bomb)
    with pytest.raises(SpecpackError, match="too large"):
        read_prompt_file(Path("/dev/zero"))
