"""The tensorrt backend: its refusals, and its whole decode path over a fake TensorRT and CUDA (fake_trt.py).

The real TensorRT path needs TensorRT and a GPU (never here): test_real_tensorrt skips with the reason."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from fake_trt import PLATFORM, FakeCuda, fake_plan, fake_tensorrt

import specpack
from specpack import names
from specpack.contract.engines import Platform
from specpack.deploy.trt_build import BuildOptions, ModelBuild, build_pack_engines
from specpack.errors import SpecpackError
from specpack.runtime.backend import BackendOptions
from specpack.runtime.backends import tensorrt as trt_backend
from specpack.runtime.trt_env import tensorrt_missing

PROMPTS = [[5, 17, 42, 8, 99, 3], [200, 1, 1, 7]]


def fake_builder(graph: Path, plan: Path, profile: object, build: ModelBuild, workspace_gb: int) -> None:
    plan.write_bytes(fake_plan(graph.name))


@pytest.fixture()
def built_pack(trt_pack: Path, tmp_path: Path) -> Path:
    pack = tmp_path / "pack"
    shutil.copytree(trt_pack, pack)
    build_pack_engines(pack, BuildOptions(), platform=PLATFORM, builder=fake_builder)
    return pack


def use_fakes(monkeypatch: pytest.MonkeyPatch, platform: Platform = PLATFORM, cuda_graphs: bool = True) -> FakeCuda:
    cuda = FakeCuda()

    def load(path: Path, manifest, options: BackendOptions) -> trt_backend.TrtBackend:
        return trt_backend.TrtBackend(path, manifest, options, cuda, platform,  # type: ignore[arg-type]
                                      fake_tensorrt(cuda, path, manifest.max_len), cuda_graphs=cuda_graphs)

    monkeypatch.setattr(trt_backend, "load", load)
    return cuda


def target_alone(pack: Path, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of the pack's verify graph with no drafts, driven by the static harness (no runtime code)."""
    from static_harness import StaticRunner

    from specpack.contract.manifest import Manifest

    m = Manifest.read(pack)
    runner = StaticRunner(pack / m.target.graph.path, m.target, m.max_len)
    extra = {names.DRAFT_PROBS: np.zeros((1, 0, m.vocab_size), np.float32), names.UNIFORMS: np.zeros((1, 1), np.float32),
             names.TEMPERATURE: np.zeros(1, np.float32), names.TOP_K: np.zeros(1, np.int64), names.TOP_P: np.ones(1, np.float32)}
    out, ids = [], np.array(prompt, np.int64)
    while len(out) < n:
        token = int(runner.run(ids, **extra)[names.NEXT_TOKEN][0])
        out.append(token)
        if token in m.eos_token_ids:
            break
        ids = np.array([token], np.int64)
    return out


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_greedy_through_fake_engines_equals_target_alone(built_pack: Path, monkeypatch: pytest.MonkeyPatch,
                                                         cuda_graphs: bool) -> None:
    cuda = use_fakes(monkeypatch, cuda_graphs=cuda_graphs)
    pack = specpack.load(built_pack, device="tensorrt")
    for prompt in PROMPTS:
        want = target_alone(built_pack, prompt, 24)
        for k in (0, 1, 4):
            got = pack.generate(prompt, 24, k=k)
            assert got.tokens == want, (k, got.tokens, want)
        assert pack.generate(prompt, 24, k=4).stats["proposed"] > 0
    if cuda_graphs:
        assert cuda.launches > 0  # steps replayed captured graphs, reading the buffers as they were at replay
    else:
        assert cuda.launches == 0
    pack.close()
    assert not cuda.graphs


def test_refuses_an_engine_of_another_gpu_or_version(built_pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for other in (Platform("NVIDIA H100", "9.0", PLATFORM.tensorrt_version), Platform(PLATFORM.gpu, "9.0", "10.3.0.26")):
        use_fakes(monkeypatch, platform=other)
        with pytest.raises(SpecpackError) as err:
            specpack.load(built_pack, device="tensorrt")
        text = str(err.value)
        assert "built for another GPU or TensorRT version" in text
        assert f"expected: an engine built for {other}" in text
        assert f"found:    engines/nvidia-fake-gpu-sm90-trt10.13.0.35/draft_step.plan: {PLATFORM}" in text
        assert "specpack build PACK --backend tensorrt" in text


def test_an_altered_engine_is_refused_before_it_is_loaded(built_pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_fakes(monkeypatch)
    plan = next((built_pack / "engines").rglob("verify.plan"))
    plan.write_bytes(plan.read_bytes().replace(b"verify", b"vErify"))
    with pytest.raises(SpecpackError, match=r"verify\.plan does not match the manifest"):
        specpack.load(built_pack, device="tensorrt")


def test_without_engines_it_says_how_to_build_them(trt_pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_fakes(monkeypatch)
    with pytest.raises(SpecpackError, match=r"no TensorRT engine for the draft(.|\n)*specpack build PACK --backend tensorrt"):
        specpack.load(trt_pack, device="tensorrt")


def test_without_tensorrt_loading_says_so(trt_pack: Path) -> None:
    if tensorrt_missing() is None:
        pytest.skip("TensorRT is installed here")
    with pytest.raises(SpecpackError, match="TensorRT is not available"):
        specpack.load(trt_pack, device="tensorrt")


def test_generate_without_tensorrt_exits_2(trt_pack: Path) -> None:
    from click.testing import CliRunner

    from specpack.cli.main import cli

    if tensorrt_missing() is None:
        pytest.skip("TensorRT is installed here")
    result = CliRunner().invoke(cli, ["generate", str(trt_pack), "--prompt", "x", "--device", "tensorrt"])
    assert result.exit_code == 2 and "TensorRT is not available" in result.output and "Traceback" not in result.output


def test_real_tensorrt_engines_give_the_target_alone(trt_pack: Path, tmp_path: Path) -> None:
    """Where TensorRT and a GPU are present: real engines (fp32 graphs, fp16 flag), greedy == the target alone."""
    why = tensorrt_missing()
    if why is not None:
        pytest.skip(f"needs TensorRT and a GPU: {why}")
    pack_dir = tmp_path / "pack"
    shutil.copytree(trt_pack, pack_dir)
    build_pack_engines(pack_dir, BuildOptions(precision="fp16"))
    pack = specpack.load(pack_dir, device="tensorrt")
    for prompt in PROMPTS:
        assert pack.generate(prompt, 24, k=4).tokens == target_alone(pack_dir, prompt, 24)


def test_deterministic_drafts_use_the_one_hot_buffer(built_pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """q None (an n-gram drafter's): right drafts are all accepted, wrong ones rejected; the output is the target's."""
    from harness import LookupDrafter

    use_fakes(monkeypatch)
    loaded = specpack.load(built_pack, device="tensorrt")
    prompt = PROMPTS[0]
    want = target_alone(built_pack, prompt, 20)
    for shift, accepted in ((0, True), (1, False)):
        def continuation(state, shift=shift) -> list[int]:
            done = state.length - len(prompt)
            return [(t + shift) % loaded.manifest.vocab_size for t in want[done:]]

        pack = specpack.Pack(loaded.path, loaded.manifest, loaded.tokenizer, loaded.backend, LookupDrafter(continuation))
        got = pack.generate(prompt, 20, k=4)
        assert got.tokens == want
        assert (got.stats["alpha"] == 1.0) if accepted else (got.stats["accepted"] == 0)


def test_sampled_tokens_are_the_same_with_and_without_cuda_graphs(built_pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replayed graphs read the uniforms and ids copied in before each launch: the same seed, the same tokens."""
    runs = []
    for cuda_graphs in (False, True):
        cuda = use_fakes(monkeypatch, cuda_graphs=cuda_graphs)
        pack = specpack.load(built_pack, device="tensorrt")
        runs.append([pack.generate(p, 24, k=k, temperature=0.9, top_p=0.95, seed=s).tokens
                     for p in PROMPTS for k in (0, 3) for s in (0, 1)])
        assert (cuda.launches > 0) == cuda_graphs
    assert runs[0] == runs[1]
    assert len({tuple(t) for t in runs[0]}) > 1


def test_greedy_single_steps_run_two_rows(built_pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tensorrt backend goes through the same Target as the others (runtime/target.py): after the prefill a
    greedy k = 0 step runs the verify over two rows (the token and a pad draft, k = 1), never one row alone; the
    tokens are the target's."""
    use_fakes(monkeypatch)
    pack = specpack.load(built_pack, device="tensorrt")
    prompt = PROMPTS[1]  # 4 tokens: its prefill is captured too (<= k_max + 1)
    assert pack.generate(prompt, 16, k=0).tokens == target_alone(built_pack, prompt, 16)
    shapes = {(s, k) for s, k, _, _ in pack.backend.target().engine.graphs}  # type: ignore[attr-defined]
    assert shapes == {(len(prompt), 0), (2, 1)}, shapes
