"""An int4 pack exported with --max-batch (docs/batching.md, "What remains" 2): its batched graphs carry the batch-1
graphs' quantized weights in the batch-1 graphs' data files (the manifest says so, the integrity checks cover every
file), and requests decoded together through the scheduler get the tokens the same pack gives each alone: bit for
bit, since MatMulNBits computes each row independently of the batch on the CPU (tests/quantize/test_batched_quantize.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import specpack
from specpack.contract.integrity import verify_pack
from specpack.contract.manifest import parse_manifest
from specpack.errors import SpecpackError
from specpack.hashing import sha256_file
from specpack.names import BATCHED_FILES
from specpack.runtime.backend import BackendOptions
from specpack.runtime.pack import Pack
from specpack.runtime.request import GenerateRequest
from tests.runtime.test_batched_sampling import batched_tokens

pytestmark = pytest.mark.slow  # an int4 pack export with --max-batch (~25 s on 2 cores)

FAMILY, DRAFT, SLOTS = "qwen2", "noisy", 4
DATA = {"draft": "draft_step.onnx.data", "target": "verify.onnx.data"}


@pytest.fixture(scope="module")
def pack_dir(tiny_export: Callable[..., Path]) -> Path:
    return tiny_export(FAMILY, DRAFT, k=4, max_batch=SLOTS, quantize_draft="int4", quantize_target="int4",
                       fidelity=False)


@pytest.fixture(scope="module")
def alone(pack_dir: Path) -> Iterator[Pack]:
    with specpack.load(pack_dir, threads=1) as pack:
        yield pack


def _requests(pack: Pack) -> list[GenerateRequest]:
    """Greedy rows (model drafts at k 2 and 4, n-gram, k 0) and two seeded sampling rows."""
    rng = np.random.default_rng(11)
    kinds: list[dict[str, object]] = [{"k": 2}, {"k": 4}, {"k": 3, "drafter": "ngram"}, {"k": 0},
                                      {"k": 4, "temperature": 1.0, "seed": 3},
                                      {"k": 2, "temperature": 0.7, "top_k": 20, "seed": 5}]
    return [GenerateRequest.of(rng.integers(0, pack.manifest.vocab_size - 8, 8 + 3 * i).tolist(), 24,
                               limits=pack.limits, **kind)  # type: ignore[arg-type]
            for i, kind in enumerate(kinds)]


def test_the_manifest_records_the_shared_quantized_weights(pack_dir: Path) -> None:
    m = parse_manifest((pack_dir / "manifest.json").read_bytes())
    for role, model in m.models():
        batched = model.batched
        assert batched is not None and batched.quantization is not None and model.quantization is not None
        assert batched.quantization.method == model.quantization.method == "int4"
        record = batched.quantization.model_dump()
        assert record["same_weights"] is True and record["shared"]["data_file"] == DATA[role]
        assert batched.graph.path == BATCHED_FILES[role] and batched.graph.data_files == [DATA[role]]
        assert model.graph.data_files == [DATA[role]]
    listed = [f.path for f in m.files]
    assert len(listed) == len(set(listed)) and not any(p.startswith(tuple(BATCHED_FILES.values())) and
                                                       p.endswith(".data") for p in listed)
    assert set(m.loaded_files()) <= set(listed)


def test_a_batched_entry_must_say_its_quantization(pack_dir: Path) -> None:
    data = json.loads((pack_dir / "manifest.json").read_text())
    data["target"]["batched"]["quantization"] = None
    with pytest.raises(SpecpackError, match="batched graph's quantization"):
        parse_manifest(json.dumps(data).encode())


def test_integrity_covers_the_shared_data_file(pack_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "pack"
    shutil.copytree(pack_dir, copy)
    m = parse_manifest((copy / "manifest.json").read_bytes())
    assert set(DATA.values()) <= set(verify_pack(copy, m, full=True))
    data = copy / DATA["target"]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 1
    data.write_bytes(bytes(raw))
    with pytest.raises(SpecpackError, match=DATA["target"]):
        specpack.load(copy)
    with pytest.raises(SpecpackError, match=DATA["target"]):
        specpack.load(copy, manifest_sha256=sha256_file(copy / "manifest.json"))


@pytest.mark.parametrize("pinned", [False, True])
def test_requests_together_get_their_lone_tokens(pack_dir: Path, alone: Pack, pinned: bool) -> None:
    """Six requests on four rows through the pack's own int4 batched graphs (pinned: the verified bytes, both graphs
    reading one data file's) give exactly the tokens the pack gives each alone, with batch-1 graphs."""
    requests = _requests(alone)
    expected = [alone.generate_request(r).tokens for r in requests]
    digest = sha256_file(pack_dir / "manifest.json") if pinned else None
    with specpack.load(pack_dir, threads=1, options=BackendOptions(slots=SLOTS), manifest_sha256=digest) as pack:
        assert batched_tokens(pack, requests) == (expected, SLOTS)
