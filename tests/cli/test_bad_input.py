"""Each bad input exits non-zero with a message that says what was expected and what was found."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from specpack.cli.main import cli, spec_export


def _run(args: list[str], command=cli) -> tuple[int, str]:
    result = CliRunner().invoke(command, args)
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes else "")


def _assert_error(code: int, text: str, *fragments: str) -> None:
    assert code != 0, text
    assert "Traceback" not in text
    for fragment in fragments:
        assert fragment in text, text


def test_missing_model_path(tmp_path: Path) -> None:
    code, text = _run(["--draft", str(tmp_path / "nope"), "--target", str(tmp_path / "nope2"), "-o", str(tmp_path / "p")],
                      spec_export)
    _assert_error(code, text, "does not exist", "expected", "found")
    assert not (tmp_path / "p").exists()


def test_not_a_causal_lm(tmp_path: Path, tiny_pairs) -> None:
    from transformers import BertConfig

    bert = tmp_path / "bert"
    config = BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    config.save_pretrained(bert)
    _, target = tiny_pairs("qwen2")
    code, text = _run(["--draft", str(bert), "--target", str(target), "-o", str(tmp_path / "p")], spec_export)
    _assert_error(code, text, "bert", "expected", "found")


def test_mismatched_tokenizers(tmp_path: Path, tiny_pairs) -> None:
    gpt2_draft, _ = tiny_pairs("gpt2")
    _, qwen_target = tiny_pairs("qwen2")
    code, text = _run(["--draft", str(gpt2_draft), "--target", str(qwen_target), "-o", str(tmp_path / "p")], spec_export)
    _assert_error(code, text, "id ", "draft", "target")
    assert not (tmp_path / "p").exists() and not list(tmp_path.glob(".p.partial-*"))


@pytest.mark.parametrize("k", ["0", "17", "-1"])
def test_export_k_out_of_range(tmp_path: Path, tiny_pairs, k: str) -> None:
    draft, target = tiny_pairs("qwen2")
    code, text = _run(["--draft", str(draft), "--target", str(target), "-o", str(tmp_path / "p"), "--k", k], spec_export)
    _assert_error(code, text, "1..16", k)


def test_max_len_above_position_limit(tmp_path: Path, tiny_pairs) -> None:
    draft, target = tiny_pairs("qwen2")
    code, text = _run(["--draft", str(draft), "--target", str(target), "-o", str(tmp_path / "p"), "--max-len", "100000"],
                      spec_export)
    _assert_error(code, text, "--max-len", "256", "100000")


@pytest.fixture(scope="module")
def pack(tiny_pack) -> Path:
    return tiny_pack("qwen2", "noisy")[0]


@pytest.mark.parametrize(("k", "allowed"), [("-1", "0..16"), ("17", "0..16"), ("9", "0..8")])
def test_generate_k_out_of_range(pack: Path, k: str, allowed: str) -> None:
    """Past any pack's limit before loading it; past this pack's k_max (8) once loaded."""
    code, text = _run(["generate", str(pack), "--prompt", "hi", "--k", k])
    _assert_error(code, text, allowed, k)


def test_generate_unknown_device(pack: Path) -> None:
    code, text = _run(["generate", str(pack), "--prompt", "hi", "--device", "gpu"])
    _assert_error(code, text, "unknown device", "cpu | cuda | reference")


def test_prompt_longer_than_max_len(pack: Path) -> None:
    code, text = _run(["generate", str(pack), "--prompt", "def add(a, b): " * 40, "--max-new-tokens", "200"])
    _assert_error(code, text, "max length", "expected", "found")


def test_empty_prompt(pack: Path, tmp_path: Path) -> None:
    code, text = _run(["generate", str(pack), "--prompt", ""])
    _assert_error(code, text, "empty prompt")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    code, text = _run(["generate", str(pack), "--prompt-file", str(empty)])
    _assert_error(code, text, "empty prompt")


def test_missing_pack(tmp_path: Path) -> None:
    code, text = _run(["generate", str(tmp_path / "nope"), "--prompt", "hi"])
    _assert_error(code, text, "no pack", "expected", "found")


@pytest.mark.parametrize("flag", [["--temperature", "-1"], ["--top-p", "0"], ["--top-p", "1.5"], ["--top-k", "-3"],
                                  ["--temperature", "nan"]])
def test_invalid_sampling_parameters(pack: Path, flag: list[str]) -> None:
    code, text = _run(["generate", str(pack), "--prompt", "hi", *flag])
    _assert_error(code, text, flag[0].lstrip("-").replace("-", "_"), "expected", "found")


def test_corrupted_pack_file_is_caught_before_loading(pack: Path, tmp_path: Path) -> None:
    copy = tmp_path / "pack"
    shutil.copytree(pack, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    victim = copy / manifest["target"]["graph"]["data_files"][0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one flipped byte
    victim.write_bytes(bytes(data))
    code, text = _run(["generate", str(copy), "--prompt", "hi"])
    _assert_error(code, text, "does not match the manifest", "sha256")
    code, text = _run(["verify", str(copy)])
    _assert_error(code, text, "does not match the manifest")


def test_verify_and_inspect_a_good_pack(pack: Path) -> None:
    code, text = _run(["verify", str(pack)])
    assert code == 0 and "ok" in text
    code, text = _run(["inspect", str(pack)])
    assert code == 0 and "verify.onnx" in text and "draft_step.onnx" in text
    code, text = _run(["inspect", str(pack), "--json"])
    out = json.loads(text)
    assert code == 0 and out["manifest"]["k_max"] == 8 and len(out["manifest_sha256"]) == 64


def test_generate_json_prints_one_object(pack: Path) -> None:
    code, text = _run(["generate", str(pack), "--prompt", "def add(a, b):", "--max-new-tokens", "12", "--json"])
    assert code == 0, text
    out = json.loads(text)
    assert set(out) == {"tokens", "text", "finish_reason", "stats"} and len(out["tokens"]) <= 12
    assert {"alpha", "tau", "steps", "proposed", "accepted", "per_position", "tokens_per_s"} <= set(out["stats"])


def test_model_dir_without_weights(tmp_path: Path, tiny_pairs) -> None:
    draft, target = tiny_pairs("qwen2")
    bare = tmp_path / "bare"
    shutil.copytree(target, bare, ignore=shutil.ignore_patterns("*.safetensors"))
    code, text = _run(["--draft", str(draft), "--target", str(bare), "-o", str(tmp_path / "p")], spec_export)
    _assert_error(code, text, "has no weights", "config.json")
    assert code == 2 and not (tmp_path / "p").exists()


@pytest.mark.parametrize("args", [["--k", "0"], ["--k", "3", "--device", "reference", "--threads", "1"]])
def test_generate_k0_and_the_reference_device(pack: Path, args: list[str]) -> None:
    code, text = _run(["generate", str(pack), "--prompt", "def add(a, b):", "--max-new-tokens", "8", "--json", *args])
    assert code == 0, text
    out = json.loads(text)
    assert out["finish_reason"] in ("eos", "length") and out["stats"]["k"] == int(args[1])


def test_generate_k_auto_with_the_ngram_drafter(pack: Path) -> None:
    code, text = _run(["generate", str(pack), "--prompt", "def add(a, b): def add(a, b):", "--max-new-tokens", "8",
                       "--json", "--k", "auto", "--drafter", "ngram"])
    assert code == 0, text
    stats = json.loads(text)["stats"]
    assert stats["drafter"] == "ngram" and stats["k_policy"] == "auto" and sum(stats["k_asked_histogram"]) == stats["steps"]


def test_generate_k_not_a_number(pack: Path) -> None:
    code, text = _run(["generate", str(pack), "--prompt", "hi", "--k", "fast"])
    _assert_error(code, text, "invalid --k", "'fast'")


def test_model_drafter_on_a_pack_without_a_draft_model(tiny_ngram_pack) -> None:
    code, text = _run(["generate", str(tiny_ngram_pack("qwen2")[0]), "--prompt", "hi", "--drafter", "model"])
    _assert_error(code, text, "has no draft model", "--drafter ngram")


def test_export_drafter_ngram_with_a_draft(tiny_pairs, tmp_path: Path) -> None:
    draft, target = tiny_pairs("qwen2")
    code, text = _run(["--draft", str(draft), "--target", str(target), "--drafter", "ngram", "-o", str(tmp_path / "p")],
                      spec_export)
    _assert_error(code, text, "--draft and --drafter disagree", "with --draft")


@pytest.mark.parametrize("args", [["--draft", "d", "--target", "t", "-o", ""], ["deploy", "jetson", "pack", "-o", ""]])
def test_an_empty_output_path_is_refused_as_such(args: list[str]) -> None:
    code, text = _run(args, spec_export if args[0] == "--draft" else cli)
    _assert_error(code, text, "an empty path")
    assert code == 2


def test_deploy_under_a_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    code, text = _run(["deploy", "jetson", str(tmp_path / "nope"), "-o", str(tmp_path / "f" / "bundle")])
    _assert_error(code, text, "is a file, not a directory")


def test_prompt_file_is_read_up_to_a_limit() -> None:
    code, text = _run(["generate", "no-pack", "--prompt-file", "/dev/zero"])
    _assert_error(code, text, "--prompt-file /dev/zero is too large", "at most 4,194,304 bytes")
    assert code == 2
