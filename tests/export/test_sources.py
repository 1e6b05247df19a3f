"""Model sources (local dir, hub id, GGUF) and the model facts read from config.json."""

from __future__ import annotations

import hashlib
import sys
import types
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

from specpack.errors import SpecpackError
from specpack.export.model_info import ModelInfo, read_model_info
from specpack.export.sources import resolve_source, source_record


def _no_hub(*args, **kwargs):
    raise AssertionError("a local-looking path must not reach the hub")


# --- read_model_info ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("family", "kv_heads"), [("llama", 2), ("qwen2", 2), ("mistral", 2), ("gpt2", 4)])
def test_read_model_info(family: str, kv_heads: int, tiny_pairs) -> None:
    draft, target = tiny_pairs(family)
    info = read_model_info(target)
    from transformers import AutoTokenizer

    rows = len(AutoTokenizer.from_pretrained(target))
    # gpt2 has no separate kv heads: every head is a kv head
    assert info == ModelInfo(model_type=family, num_layers=3, kv_heads=kv_heads, head_dim=12, vocab_rows=rows,
                             max_positions=256)
    assert read_model_info(draft).num_layers == 1


def test_vocab_rows_include_padding(tiny_pairs) -> None:
    _, target = tiny_pairs("qwen2", pad_rows=6, head_dim=8, max_positions=128)
    _, unpadded = tiny_pairs("qwen2")
    info = read_model_info(target)
    assert info.vocab_rows == read_model_info(unpadded).vocab_rows + 6
    assert (info.head_dim, info.max_positions) == (8, 128)


@pytest.mark.parametrize(("config_cls", "found"), [("BertConfig", "'bert'"), ("T5Config", "'t5'")])
def test_not_a_causal_lm(config_cls: str, found: str, tmp_path: Path) -> None:
    import transformers

    getattr(transformers, config_cls)(num_layers=1, num_hidden_layers=1).save_pretrained(tmp_path)
    with pytest.raises(SpecpackError) as err:
        read_model_info(tmp_path)
    message = str(err.value)
    assert f"found:    model_type {found}" in message
    assert "expected: a decoder-only causal language model" in message and "qwen2" in message


def test_model_dir_without_config(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(SpecpackError, match=r"has no config\.json") as err:
        read_model_info(tmp_path)
    assert "model.safetensors" in str(err.value)


def test_missing_model_dir(tmp_path: Path) -> None:
    with pytest.raises(SpecpackError, match="does not exist"):
        read_model_info(tmp_path / "nope")


# --- resolve_source ----------------------------------------------------------------------------------------------

def test_local_dir_resolves_to_itself(tiny_pairs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _no_hub)
    _, target = tiny_pairs("llama")
    assert resolve_source(str(target)) == target


def test_local_dir_without_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _no_hub)
    with pytest.raises(SpecpackError, match=r"has no config\.json"):
        resolve_source(str(tmp_path))


@pytest.mark.parametrize("src", ["./models/nope", "/no/such/model", "models/qwen/nope", "~/nope-model", "a b/c"])
def test_local_looking_path_is_not_looked_up(src: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _no_hub)
    with pytest.raises(SpecpackError, match="no such file or directory"):
        resolve_source(src)


def test_hub_id_downloads(tiny_pairs, monkeypatch: pytest.MonkeyPatch) -> None:
    _, target = tiny_pairs("gpt2")
    calls = []

    def fake(repo_id: str, **kwargs) -> str:
        calls.append((repo_id, kwargs))
        return str(target)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    assert resolve_source("org/tiny-gpt2") == target
    assert calls[0][0] == "org/tiny-gpt2" and "*.safetensors" in calls[0][1]["allow_patterns"]
    assert len(calls) == 1  # safetensors found: no second call for *.bin


def _hub_error(cls: type[Exception], message: str) -> Exception:
    err = cls.__new__(cls)  # the real constructors want an HTTP response
    Exception.__init__(err, message)
    return err


@pytest.mark.parametrize(("error", "says"), [
    (_hub_error(RepositoryNotFoundError, "404 Repository Not Found"), "has no such repo"),
    (LocalEntryNotFoundError("Cannot reach the hub: ConnectError"), "could not be reached"),
    (_hub_error(huggingface_hub.errors.HfHubHTTPError, "500 Server Error"), "downloading it"),
])
def test_hub_failures(error: Exception, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(repo_id: str, **kwargs):
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    with pytest.raises(SpecpackError, match=says) as err:
        resolve_source("nobody/no-such-model")
    assert "nobody/no-such-model does not exist locally" in str(err.value)


def test_gguf_goes_to_convert_gguf(tiny_pairs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, target = tiny_pairs("qwen2")
    gguf = tmp_path / "model.Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF fake")
    seen: list[Path] = []

    def convert_gguf(path: Path) -> Path:
        seen.append(path)
        return target

    fake = types.ModuleType("specpack.export.gguf")
    fake.convert_gguf = convert_gguf  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "specpack.export.gguf", fake)

    assert resolve_source(str(gguf)) == target
    assert seen == [gguf]
    with pytest.raises(SpecpackError, match="no such file or directory"):
        resolve_source(str(tmp_path / "missing.gguf"))

    record = source_record(str(gguf), target)
    assert record["files"]["model.Q4_K_M.gguf"] == hashlib.sha256(b"GGUF fake").hexdigest()  # type: ignore[index]


# --- source_record -----------------------------------------------------------------------------------------------

def test_source_record(tiny_pairs) -> None:
    _, target = tiny_pairs("llama")
    record = source_record("my/llama", target)
    assert record["source"] == "my/llama" and record["resolved"] == str(target)
    assert record["model_type"] == "llama"
    files = record["files"]
    assert isinstance(files, dict) and sorted(files) == ["config.json", "model.safetensors"]
    for name, digest in files.items():
        assert digest == hashlib.sha256((target / name).read_bytes()).hexdigest()
