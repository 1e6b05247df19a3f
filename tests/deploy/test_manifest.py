"""The manifest schema: a valid manifest reads back; every bad value of the issue's findings is refused by field."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specpack.contract.manifest import MANIFEST_FILE, Manifest, parse_manifest
from specpack.errors import SpecpackError
from tests.deploy.manifests import VOCAB, valid_manifest


def _read(raw: Any) -> Manifest:
    return parse_manifest(json.dumps(raw).encode() if not isinstance(raw, bytes) else raw)


def _mutated(change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    raw = copy.deepcopy(valid_manifest())
    change(raw)
    return raw


def test_valid_manifest_reads_and_round_trips() -> None:
    manifest = _read(valid_manifest())
    assert manifest.draft.num_layers == 2 and manifest.target.graph.kv_cache == "concat"
    assert manifest.quantization is None and manifest.drafter == "model"
    assert _read(json.loads(manifest.to_json())) == manifest
    assert "tokenizer/tokenizer.json" in manifest.loaded_files()


def test_packs_written_before_per_model_quantization_still_read() -> None:
    assert _read(_mutated(lambda m: m.update(quantization=None))).quantization is None


def test_fields_other_helpers_add_have_room() -> None:
    """Per-model dtype and quantization record, graph KV form, engines, an n-gram drafter without a draft."""
    def change(m: dict[str, Any]) -> None:
        m["target"]["dtype"] = "fp32"
        m["target"]["quantization"] = {
            "method": "int4", "block_size": 32, "accuracy_level": 4,
            "tensors": [{"tensor": "model.layers.0.mlp.up_proj.weight", "path": "int4", "k": 896}],
            "fidelity": {"alpha": 0.8, "tau": 3.9, "top1_agreement": 0.97, "mean_kl": 0.01},
            "calibration": {"method": "minmax", "samples": 128, "dataset_sha256": "a" * 64,
                            "versions": {"onnxruntime": "1.32.0"}, "seed": 0},
            "future_detail": {"any": ["json", 1]}}
        m["target"]["graph"]["kv_cache"] = "static"
        m["target"]["graph"]["attention"] = "gqa"
        m["files"].append({"path": "engines/h200/verify.plan", "sha256": "b" * 64, "size": 3})
        m["engines"] = [{"path": "engines/h200/verify.plan", "role": "target", "backend": "tensorrt",
                         "gpu": "NVIDIA H200", "compute_capability": "9.0", "tensorrt_version": "10.13.0"}]
    manifest = _read(_mutated(change))
    assert manifest.quantization == "target int4"
    assert manifest.target.quantization is not None and manifest.target.quantization.block_size == 32
    assert "engines/h200/verify.plan" in manifest.loaded_files()

    def ngram(m: dict[str, Any]) -> None:
        m["drafter"] = "ngram"
        del m["draft"]
    no_draft = _read(_mutated(ngram))
    assert [role for role, _ in no_draft.models()] == ["target"]
    with pytest.raises(SpecpackError, match="no draft model"):
        _ = no_draft.draft


BAD = {  # finding -> (mutation, text the error must contain)
    "a JSON list": (lambda m: None, "a JSON array"),
    "max_len 1e12": (lambda m: m.update(max_len=10**12), "max_len"),
    "max_len past the position limit": (lambda m: m.update(max_len=300), "position limit"),
    "eos ids a string": (lambda m: m.update(eos_token_ids="x"), "eos_token_ids"),
    "eos id past the vocabulary": (lambda m: m.update(eos_token_ids=[VOCAB]), "outside the vocabulary"),
    "bool eos id": (lambda m: m.update(eos_token_ids=[True]), "eos_token_ids"),
    "negative dim": (lambda m: m["draft"].update(kv_heads=-1), "draft.kv_heads"),
    "float layers": (lambda m: m["draft"].update(num_layers=2.0), "draft.num_layers"),
    "short sha256": (lambda m: m["files"][0].update(sha256="abc"), "files[0].sha256"),
    "absolute path": (lambda m: m["files"][0].update(path="/etc/shadow"), "relative POSIX path"),
    "parent path": (lambda m: m["files"][0].update(path="../../../../etc/passwd"), "relative POSIX path"),
    "windows path": (lambda m: m["files"][0].update(path="C:\\x"), "relative POSIX path"),
    "files emptied": (lambda m: m.update(files=[]), "files"),
    "graph not listed": (lambda m: m["target"]["graph"].update(path="other.onnx"), "not listed"),
    "graph outside the pack": (lambda m: m["target"]["graph"].update(path="../verify.onnx"), "relative POSIX path"),
    "tokenizer not listed": (lambda m: m.update(files=[f for f in m["files"] if "tokenizer.json" not in f["path"]]),
                             "tokenizer/tokenizer.json"),
    "file listed twice": (lambda m: m["files"].append(dict(m["files"][0])), "listed twice"),
    "unknown field": (lambda m: m.update(surprise=1), "surprise"),
    "layers do not match the KV inputs": (lambda m: m["draft"].update(num_layers=3), "num_layers 3"),
    "kv heads do not match the graph": (lambda m: m["target"].update(kv_heads=4), "kv_heads is 4"),
    "dtype does not match the graph": (lambda m: m["target"].update(dtype="fp16"), "needs float16"),
    "probs narrower than the vocabulary": (lambda m: m["draft"]["graph"]["outputs"][1].update(shape=[1, 7]),
                                           "vocab_size"),
    "draft without drafter model": (lambda m: m.update(drafter="ngram"), "no draft model entry"),
    "vocab larger than the rows": (lambda m: m["draft"].update(vocab_rows=VOCAB - 1), "vocab_rows"),
    "control characters in a source": (lambda m: m["draft"]["source"].update(source="x\x1b[2J"), "control"),
    "k_max past the limit": (lambda m: m.update(k_max=17), "k_max"),
    "unknown quantization": (lambda m: m["draft"].update(quantization={"method": "int3"}), "quantization.method"),
    "an engine that is a graph's file": (lambda m: m.update(engines=[{
        "path": m["target"]["graph"]["path"], "role": "target", "backend": "tensorrt", "gpu": "NVIDIA H200",
        "compute_capability": "9.0", "tensorrt_version": "10.13.0"}]), "engines name files that are graphs"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_fields_are_refused_by_name(case: str) -> None:
    mutate, says = BAD[case]
    raw: Any = [valid_manifest()] if case == "a JSON list" else _mutated(mutate)
    with pytest.raises(SpecpackError) as err:
        _read(raw)
    assert says in str(err.value)
    assert "expected" in str(err.value) and "hint" in str(err.value)


@pytest.mark.parametrize(("version", "says"), [(2, "upgrade specpack"), (0, "re-export"), (True, "re-export"),
                                               ("1", "re-export"), (None, "re-export")])
def test_unknown_schema_versions_are_refused(version: object, says: str) -> None:
    with pytest.raises(SpecpackError, match="unsupported pack schema") as err:
        _read(_mutated(lambda m: m.update(schema_version=version)))
    assert says in str(err.value)


@pytest.mark.parametrize(("text", "says"), [
    (b"[" * 100_000 + b"]" * 100_000, "nested"),
    (b'{"a": ' * 30 + b"1" + b"}" * 30, "nested deeper than"),
    (b'{"schema_version": 1, "schema_version": 1}', "repeats a key"),
    (b'{"schema_version": NaN}', "NaN"),
    (b'{"schema_version": 1, "max_len": 1e999}', "not a finite number"),
    (b'{"schema_version": 1, "max_len": -1E400}', "not a finite number"),
    (b'{"schema_version": 1, "max_len": 1' + b"0" * 5000 + b"}", "digits"),
    (b'{"x": "\\ud800"}', "lone surrogate"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b"", "Expecting value"),
])
def test_hostile_json_is_refused_without_crashing(text: bytes, says: str) -> None:
    with pytest.raises(SpecpackError) as err:
        _read(text)
    assert says in str(err.value)


def test_manifest_read_refuses_links_out_and_huge_files(tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(valid_manifest()))
    pack = tmp_path / "pack"
    pack.mkdir()
    (pack / MANIFEST_FILE).symlink_to(outside)
    with pytest.raises(SpecpackError, match="outside the pack"):
        Manifest.read(pack)
    (pack / MANIFEST_FILE).unlink()
    with open(pack / MANIFEST_FILE, "wb") as f:
        f.truncate(17 << 20)  # sparse: 17 MB of zeros
    with pytest.raises(SpecpackError, match="too large"):
        Manifest.read(pack)


def test_pinned_digest(tmp_path: Path) -> None:
    from specpack.contract.manifest import manifest_sha256

    (tmp_path / MANIFEST_FILE).write_text(json.dumps(valid_manifest()))
    digest = manifest_sha256(tmp_path)
    assert Manifest.read(tmp_path, sha256=digest.upper()).k_max == 4
    with pytest.raises(SpecpackError, match="not the manifest this pack was pinned to"):
        Manifest.read(tmp_path, sha256="0" * 64)
    with pytest.raises(SpecpackError, match="64 hex digits"):
        Manifest.read(tmp_path, sha256="abc")
