"""Pack on a tiny pack (CPU backend): shared between threads, robust to a failing on_text, cancellable within
a step, the draft opened only when drafts are asked for, finish reasons."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import specpack
from specpack.errors import SpecpackError
from specpack.runtime.pack import Pack

PROMPT = "def add(a, b):"
REQUESTS = [  # generate() keywords: greedy and sampled, several k
    {"k": 4}, {"k": 0}, {"k": 2, "temperature": 1.0, "seed": 3}, {"k": 8, "temperature": 0.7, "top_p": 0.9, "seed": 4},
]


@pytest.fixture(scope="module")
def pack_dir(tiny_pack) -> Path:
    return tiny_pack("qwen2", "noisy")[0]


@pytest.fixture(scope="module")
def pack(pack_dir: Path) -> Pack:
    return specpack.load(pack_dir, threads=1)


def test_two_threads_on_one_pack_give_the_sequential_results(pack: Pack) -> None:
    expected = [pack.generate(PROMPT, 30, **kwargs).tokens for kwargs in REQUESTS]
    results: dict[tuple[int, int], list[int]] = {}
    start = threading.Barrier(2)

    def worker(w: int) -> None:
        start.wait()
        for i, kwargs in enumerate(REQUESTS if w == 0 else REQUESTS[::-1]):
            results[(w, i)] = pack.generate(PROMPT, 30, **kwargs).tokens

    threads = [threading.Thread(target=worker, args=(w,)) for w in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [results[(0, i)] for i in range(4)] == expected
    assert [results[(1, i)] for i in range(4)] == expected[::-1]


def test_an_exception_from_on_text_leaves_the_pack_usable(pack: Pack) -> None:
    kwargs = {"k": 4, "temperature": 1.0, "seed": 9}
    expected = pack.generate(PROMPT, 30, **kwargs)
    pieces: list[str] = []

    def disconnect(text: str) -> None:
        pieces.append(text)
        if len(pieces) == 3:
            raise BrokenPipeError("client disconnected")

    with pytest.raises(BrokenPipeError):
        pack.generate("Hello", 40, k=8, temperature=0.8, seed=1, on_text=disconnect)
    again = pack.generate(PROMPT, 30, **kwargs)
    assert again.tokens == expected.tokens and again.stats["steps"] == expected.stats["steps"]
    streamed: list[str] = []
    assert pack.generate(PROMPT, 30, on_text=streamed.append, **kwargs).text == "".join(streamed) == expected.text


def test_cancel_stops_within_one_step(pack: Pack) -> None:
    full = pack.generate(PROMPT, 40, k=3)
    cancel = threading.Event()
    seen: list[str] = []

    def on_text(text: str) -> None:
        seen.append(text)
        cancel.set()  # after the first piece of text: the step that made it is the last one

    out = pack.generate(PROMPT, 40, k=3, on_text=on_text, cancel=cancel)
    assert out.finish_reason == "cancelled" and out.stats["steps"] <= 1
    assert 1 <= len(out.tokens) <= 1 + 4 and out.tokens == full.tokens[: len(out.tokens)]
    done = pack.generate(PROMPT, 40, k=3, cancel=cancel)  # set before the start: nothing runs
    assert done.finish_reason == "cancelled" and done.tokens == []
    assert pack.generate(PROMPT, 40, k=3).tokens == full.tokens


def test_finish_reasons(pack: Pack) -> None:
    free = pack.generate(PROMPT, 20, k=2)
    assert free.finish_reason == "length" and len(free.tokens) == 20
    stop = free.tokens[5]
    # a Pack is wiring: the same backend under a manifest whose end id is a token the target emits
    eos_pack = Pack(pack.path, pack.manifest.model_copy(update={"eos_token_ids": [stop]}), pack.tokenizer, pack.backend)
    out = eos_pack.generate(PROMPT, 20, k=2)
    assert out.finish_reason == "eos" and out.tokens == free.tokens[: free.tokens.index(stop) + 1]


def test_k0_never_opens_the_draft(pack_dir: Path) -> None:
    fresh = specpack.load(pack_dir, threads=1)
    fresh.generate(PROMPT, 20, k=0)
    fresh.generate(PROMPT, 20, k=0, temperature=1.0, seed=0)
    assert not fresh.backend.draft_loaded
    fresh.generate(PROMPT, 20, k=2)
    assert fresh.backend.draft_loaded
    fresh.close()


def test_k_range_is_the_packs(pack: Pack) -> None:
    for bad in (-1, 9, 17, 2.0, True):
        with pytest.raises(SpecpackError, match=r"0\.\.8 \(this pack's k_max; 0: the target alone\)"):
            pack.generate(PROMPT, 5, k=bad)  # type: ignore[arg-type]


def test_generate_inside_on_text_is_refused(pack: Pack) -> None:
    def nested(text: str) -> None:
        pack.generate(PROMPT, 2)

    with pytest.raises(SpecpackError, match="from inside another one"):
        pack.generate(PROMPT, 5, on_text=nested)
    assert len(pack.generate(PROMPT, 5).tokens) == 5


def test_generate_after_close_is_refused(pack_dir: Path) -> None:
    """A closed pack says so (a SpecpackError naming what to do), instead of failing inside its backend."""
    fresh = specpack.load(pack_dir)
    assert fresh.generate(PROMPT, 2, k=1).tokens
    fresh.close()
    for k in (None, 0, 2):
        with pytest.raises(SpecpackError, match="is closed") as err:
            fresh.generate(PROMPT, 2, k=k)
        assert "generate after close()" in str(err.value) and "specpack.load" in str(err.value)
    fresh.close()  # a second close does nothing


def test_ngram_must_be_an_ngram_config(pack_dir: Path) -> None:
    with pytest.raises(SpecpackError, match="NgramConfig"):
        specpack.load(pack_dir, ngram=(2, 4))  # type: ignore[arg-type]


def test_backend_options_reach_the_backend(pack_dir: Path) -> None:
    """load(options=...) hands the backend its options (bench turns pad_single_steps off); threads come from load."""
    from specpack.runtime.backend import BackendOptions

    with pytest.raises(SpecpackError, match="BackendOptions"):
        specpack.load(pack_dir, options={"pad_single_steps": False})  # type: ignore[arg-type]
    with specpack.load(pack_dir, threads=1, options=BackendOptions(pad_single_steps=False, threads=4)) as alone:
        assert alone.backend.options.pad_single_steps is False and alone.backend.options.threads == 1  # type: ignore[attr-defined]


def test_a_tokenizer_id_outside_the_graph_vocabulary_is_refused(pack: Pack, monkeypatch: pytest.MonkeyPatch) -> None:
    vocab = pack.manifest.vocab_size
    monkeypatch.setattr(pack.tokenizer, "encode", lambda text: [1, vocab])
    with pytest.raises(SpecpackError, match="outside the graphs' vocabulary") as err:
        pack.generate(PROMPT, 4, k=0)
    assert f"id {vocab}" in str(err.value)
