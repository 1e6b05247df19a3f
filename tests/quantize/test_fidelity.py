"""The fidelity measures: greedy acceptance replayed from argmaxes equals the decode loop's, and the logit
comparison's numbers on distributions whose KL is known."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from specpack.quantize.fidelity import Acceptance, LogitAgreement, PlainSession, greedy_acceptance


def test_greedy_acceptance_by_hand() -> None:
    # prompt [9, 9] then new tokens 1..6; the draft is right except when it should predict 4 or 5
    sequence = [9, 9, 1, 2, 3, 4, 5, 6]
    draft_next = [0, 1, 2, 3, 0, 0, 6, 0]  # draft_next[i]: the draft's argmax after sequence[: i + 1]
    acc = greedy_acceptance(draft_next, sequence, prompt_len=2, k=2)
    # prefill emits 1; step 1: drafts 2, 3 both accepted, the target adds 4; step 2: one draft (k capped: 2 tokens
    # left), 0 instead of 5: rejected, the target emits 5; step 3: 1 token left, k = 0, a plain verify emits 6
    assert (acc.steps, acc.proposed, acc.accepted) == (3, 3, 2)
    assert acc.alpha == pytest.approx(2 / 3) and acc.tau == pytest.approx(5 / 3)


def test_agreement_numbers() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((6, 50)).astype(np.float32)
    same = LogitAgreement()
    same.add(ref, ref)
    assert same.to_dict()["top1_agreement"] == 1.0 and same.to_dict()["mean_kl"] == pytest.approx(0.0, abs=1e-12)
    offset = LogitAgreement()
    offset.add(ref, ref + 3.0)  # softmax ignores a constant: the same distributions
    assert offset.to_dict()["mean_kl"] == pytest.approx(0.0, abs=1e-12)
    delta = 2.0
    moved = ref.copy()
    moved[:, 0] += delta  # KL(p || q) with one logit moved by delta: log(Z' / Z) - p_0 * delta
    other = LogitAgreement()
    other.add(ref, moved)
    z, p0 = np.exp(ref.astype(np.float64)).sum(-1), np.exp(ref[:, 0].astype(np.float64))
    z_moved = z - p0 + p0 * np.exp(delta)
    want = np.log(z_moved / z) - p0 / z * delta
    assert other.to_dict()["mean_kl"] == pytest.approx(float(want.mean()), rel=1e-6)  # moved is fp32: ref + delta rounds
    assert other.to_dict()["max_kl"] == pytest.approx(float(want.max()), rel=1e-6)  # moved is fp32: ref + delta rounds
    assert other.to_dict()["top1_agreement"] == np.mean(ref.argmax(-1) == moved.argmax(-1))


def test_replay_matches_the_decode_loop(tiny_pairs: Callable[..., tuple[Path, Path]],
                                        tiny_plain_graph: Callable[..., Path],
                                        tiny_pack: Callable[..., tuple[Path, Path, Path]]) -> None:
    """Greedy alpha and tau replayed from one teacher-forced draft pass equal what runtime/loop.py measures."""
    import specpack

    pack_dir, _, _ = tiny_pack("qwen2", draft="noisy")
    pack = specpack.load(pack_dir)
    draft = PlainSession(Path(tiny_plain_graph("qwen2", role="draft", draft="noisy")))
    prompts = [[5, 17, 33, 101], [7, 8, 9], [250, 3, 3, 40, 41, 42]]
    for k in (1, 3):
        replay, measured = Acceptance(), Acceptance()
        for prompt in prompts:
            alone = pack.generate(prompt, 30, k=0).tokens
            spec = pack.generate(prompt, 30, k=k)
            assert spec.tokens == alone
            sequence = prompt + alone
            greedy_acceptance(draft.logits(sequence).argmax(-1).tolist(), sequence, len(prompt), k, replay)
            measured.steps += spec.stats["steps"]
            measured.proposed += spec.stats["proposed"]
            measured.accepted += spec.stats["accepted"]
        assert 0.0 < measured.alpha < 1.0  # type: ignore[operator]  # a draft that is sometimes wrong
        assert replay.to_dict() == measured.to_dict()
    pack.close()


def test_target_agreement_on_either_models_continuations(tiny_pairs: Callable[..., tuple[Path, Path]],
                                                          tiny_plain_graph: Callable[..., Path], tmp_path: Path) -> None:
    """A quantized target's agreement and KL, teacher-forced on its own greedy continuations or on the unquantized
    target's ("reference": what bench/calibrated_draft.py uses); a graph against itself agrees exactly either way."""
    from specpack.export.tokenizer_export import SUBDIR, write_tokenizer
    from specpack.quantize.fidelity import FidelityInputs, measure_fidelity
    from specpack.quantize.stage import quantize_plain_graph

    _, target_dir = tiny_pairs("qwen2")
    plain = Path(tiny_plain_graph("qwen2"))
    quantized = tmp_path / "target.int4.onnx"
    quantize_plain_graph(plain, quantized, "int4")
    tokenizer = write_tokenizer(target_dir, tmp_path)
    prompts = ([("def add(a, b):", False), ("The sky is", False)], "test")

    def measure(target: Path, continuations: str, draft_reference: Path | None = None) -> dict[str, float]:
        inputs = FidelityInputs(target=target, draft=plain, target_reference=plain, draft_reference=draft_reference,
                                tokenizer_dir=tmp_path / SUBDIR, eos_ids=tuple(tokenizer.eos_token_ids), ks=(1,),
                                new_tokens=12, continuations=continuations)
        return measure_fidelity(inputs, prompts)["target"]  # type: ignore[no-any-return]

    for continuations in ("target", "reference"):
        same = measure(plain, continuations)
        assert same["top1_agreement"] == 1.0 and same["mean_kl"] == pytest.approx(0.0, abs=1e-9), same
        moved = measure(quantized, continuations)
        assert moved["positions"] == same["positions"] or continuations == "target"
        assert 0.0 < moved["top1_agreement"] <= 1.0 and moved["mean_kl"] > 0.0, moved
        assert ("unquantized target's greedy" in moved["against"]) == (continuations == "reference")
    with pytest.raises(ValueError, match="quantized target alone"):
        measure(quantized, "reference", draft_reference=plain)
