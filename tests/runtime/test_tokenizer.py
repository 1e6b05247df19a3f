"""PackTokenizer against transformers: the same ids, the same text, a stream that adds up to the same text."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specpack.errors import SpecpackError
from specpack.export.tokenizer_export import write_tokenizer
from specpack.runtime.tokenizer import (
    CONFIG_FILE,
    TOKENIZER_FILE,
    PackTokenizer,
    TextStream,
    clean_up_tokenization,
)
from tests.tiny import FAMILIES, make_tokenizer

TEXTS = [
    "", " ", "  ", "\n", "\t", "\r\n",
    "Hello world!", " leading space", "trailing space ", "  both ends  ",
    "def add(a, b):\n    return a + b\n", "\tif x:\n\t\treturn 1\r\n",
    "for i in range(10):\n    print(i * i)  # square\n\n\n", "class A:\n  \tpass  \n",
    "Ünïcödé tèxt", "中文字符和日本語のテキスト", "emoji 🙂🚀👍🏽 and a family 👨\u200d👩\u200d👧",
    "no\u00a0break\u200bzero width", "1234567890 3.14159 -42",
    "It 's fine , isn't it ? We 're here !",
    "<s>", "</s>", "<unk>", "<|endoftext|>", "<|im_start|>user\nhi<|im_end|>\n", "a<s>b</s>c",
    " <s> spaced </s> ", "[UNK] [SEP] <extra_tool>", "x" * 300,
]
VARIANTS = (*FAMILIES, "llama+bos", "qwen2+added", "gpt2+split", "wordpiece+cleanup")


def _hf_tokenizer(variant: str) -> Any:
    """A tiny tokenizer of one of the tiny families, or of a variant that exercises one more transformers rule."""
    if variant in FAMILIES:
        return make_tokenizer(variant)
    if variant == "llama+bos":  # real Llama tokenizers add BOS in the post-processor
        tok = make_tokenizer("llama")
        tok.add_bos_token = True
        return tok
    if variant == "qwen2+added":  # ChatML specials as added tokens, one non-special added token, one extra special
        tok = make_tokenizer("qwen2")
        tok.add_special_tokens({"extra_special_tokens": ["<|im_start|>", "<|tool|>"]})
        tok.add_tokens(["<extra_tool>"])
        return tok
    if variant == "gpt2+split":  # special tokens in the text are plain text
        tok = make_tokenizer("gpt2")
        tok.split_special_tokens = True
        return tok
    if variant == "wordpiece+cleanup":
        return _wordpiece_with_cleanup()
    raise ValueError(variant)


def _wordpiece_with_cleanup() -> Any:
    """A WordPiece tokenizer with clean_up_tokenization_spaces on: transformers' clean-up runs on decode."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = ["Hello , world . It 's fine ! isn't it ? We 're here , they 've gone . I 'm def add(a, b)"] * 4
    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=False)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(cleanup=False)
    backend.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=150, special_tokens=["[UNK]", "[SEP]"]))
    return PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=True,
                                   unk_token="[UNK]", eos_token="[SEP]")


@pytest.fixture(scope="module", params=VARIANTS)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, PackTokenizer]:
    """(transformers' AutoTokenizer of a saved model dir, the PackTokenizer exported from the same dir)."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp(request.param.replace("+", "-"))
    _hf_tokenizer(request.param).save_pretrained(root / "model")
    write_tokenizer(root / "model", root / "pack")
    return AutoTokenizer.from_pretrained(root / "model"), PackTokenizer.load(root / "pack" / "tokenizer")


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("qwen")
    make_tokenizer("qwen2").save_pretrained(root / "model")
    write_tokenizer(root / "model", root / "pack")
    return root / "pack" / "tokenizer"


def _streamed(tok: PackTokenizer, ids: list[int], skip_special_tokens: bool = True) -> tuple[list[str], str]:
    stream = tok.stream(skip_special_tokens)
    pieces = [stream.push(i) for i in ids]
    return pieces, stream.flush()


def test_encode_matches_transformers(pair: tuple[Any, PackTokenizer]) -> None:
    hf, tok = pair
    for text in TEXTS:
        assert tok.encode(text) == hf(text)["input_ids"], text


def test_vocab_size_is_len_of_transformers_tokenizer(pair: tuple[Any, PackTokenizer]) -> None:
    hf, tok = pair
    assert tok.vocab_size == len(hf)


def test_decode_matches_transformers(pair: tuple[Any, PackTokenizer]) -> None:
    hf, tok = pair
    for text in TEXTS:
        ids = hf(text)["input_ids"]
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
        assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False), text


def test_stream_adds_up_to_decode(pair: tuple[Any, PackTokenizer]) -> None:
    _, tok = pair
    for text in TEXTS:
        ids = tok.encode(text)
        for skip in (True, False):
            pieces, rest = _streamed(tok, ids, skip)
            assert "".join(pieces) + rest == tok.decode(ids, skip), text


def test_stream_adds_up_to_decode_on_random_ids(pair: tuple[Any, PackTokenizer]) -> None:
    """Any ids a model may emit: broken UTF-8, byte-fallback runs, special tokens in the middle."""
    _, tok = pair
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 120))]
        for skip in (True, False):
            pieces, rest = _streamed(tok, ids, skip)
            assert "".join(pieces) + rest == tok.decode(ids, skip), ids


def test_stream_keeps_the_space_after_a_skipped_special_token(pair: tuple[Any, PackTokenizer]) -> None:
    hf, tok = pair
    eos = tok.token_to_id(hf.eos_token)
    assert eos is not None
    ids = [*tok.encode("Hello"), eos, *tok.encode(" world")]
    pieces, rest = _streamed(tok, ids)
    assert "".join(pieces) + rest == hf.decode(ids, skip_special_tokens=True)


def test_stream_holds_back_incomplete_characters(qwen_dir: Path) -> None:
    tok = PackTokenizer.load(qwen_dir)
    ids = tok.encode("ok 🚀 done")
    assert len(ids) > len(tok.encode("ok  done")) + 1  # the rocket takes several byte tokens here
    pieces, rest = _streamed(tok, ids)
    assert not any("\ufffd" in p for p in pieces)
    assert "".join(pieces) + rest == "ok 🚀 done"
    assert rest == ""


def test_stream_prints_as_it_goes_and_restarts_after_flush(qwen_dir: Path) -> None:
    tok = PackTokenizer.load(qwen_dir)
    stream = tok.stream()
    ids = tok.encode("for i in range(10):\n    print(i)\n")
    assert [stream.push(i) for i in ids[:3]] == [tok.decode([i]) for i in ids[:3]]
    stream.flush()
    assert "".join(stream.push(i) for i in ids) + stream.flush() == tok.decode(ids)


def test_stream_decodes_short_windows() -> None:
    """Each push decodes a few ids, not the whole sequence: the cost per token does not grow with the length."""
    decoded = 0

    def decode(ids: list[int]) -> str:
        nonlocal decoded
        decoded += len(ids)
        return "".join(chr(65 + i % 26) for i in ids)

    n = 2000
    stream = TextStream(decode, None)
    text = "".join(stream.push(i) for i in range(n))
    assert text == "".join(chr(65 + i % 26) for i in range(n))
    assert decoded < 5 * n


def test_stream_redecodes_everything_when_the_window_text_changes() -> None:
    """A decoder whose window text changes under a new id (here: a leading "b" capitalized once another id follows)
    falls back to decoding all ids, so the stream still adds up to the full decode."""
    names = "abc"

    def decode(ids: list[int]) -> str:
        text = "".join(names[i] for i in ids)
        return text[0].upper() + text[1:] if len(ids) > 1 and ids[0] == 1 else text

    stream = TextStream(decode, None)
    assert [stream.push(i) for i in (0, 1, 2)] == ["a", "b", "c"]
    assert stream.flush() == ""


def test_stream_cleanup_holds_back_from_the_last_space() -> None:
    """With transformers' clean-up on, " b" is held back until the next word shows it is not " b ."."""
    words = [" a", " b", " ."]
    stream = TextStream(lambda ids: "".join(words[i] for i in ids), clean_up_tokenization)
    assert [stream.push(i) for i in (0, 1, 2)] == ["", " a", " b"]
    assert stream.flush() == "."


def test_encode_chat_without_a_template_says_what_to_do(tmp_path: Path) -> None:
    make_tokenizer("gpt2").save_pretrained(tmp_path / "model")
    write_tokenizer(tmp_path / "model", tmp_path)
    tok = PackTokenizer.load(tmp_path / "tokenizer")
    with pytest.raises(SpecpackError, match="this model has no chat template") as err:
        tok.encode_chat("hi")
    assert err.value.hint == "drop --chat and pass the prompt as plain text"


def test_runtime_imports_neither_torch_nor_transformers() -> None:
    code = ("import sys, specpack.runtime.tokenizer, specpack.runtime.chat_template; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- broken packs -------------------------------------------------------------------------------------------


def _copy(qwen_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(qwen_dir, tmp_path / "tokenizer"))


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(SpecpackError, match=CONFIG_FILE) as err:
        PackTokenizer.load(tmp_path / "nowhere")
    assert err.value.found == "no such file"


def test_missing_tokenizer_json(qwen_dir: Path, tmp_path: Path) -> None:
    d = _copy(qwen_dir, tmp_path)
    (d / TOKENIZER_FILE).unlink()
    with pytest.raises(SpecpackError, match=f"no {TOKENIZER_FILE}") as err:
        PackTokenizer.load(d)
    assert err.value.expected == f"the file {d / TOKENIZER_FILE}"
    assert err.value.found == "no such file"


@pytest.mark.parametrize("content", ["not json at all", '{"version": "1.0", "model": 3}', ""])
def test_corrupt_tokenizer_json(qwen_dir: Path, tmp_path: Path, content: str) -> None:
    d = _copy(qwen_dir, tmp_path)
    (d / TOKENIZER_FILE).write_text(content)
    with pytest.raises(SpecpackError, match="is not a valid tokenizer") as err:
        PackTokenizer.load(d)
    assert err.value.expected == "a tokenizers JSON file"
    assert err.value.found


def test_truncated_tokenizer_json(qwen_dir: Path, tmp_path: Path) -> None:
    d = _copy(qwen_dir, tmp_path)
    data = (d / TOKENIZER_FILE).read_bytes()
    (d / TOKENIZER_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(SpecpackError, match="is not a valid tokenizer"):
        PackTokenizer.load(d)


def test_tokenizer_json_from_another_tokenizer(qwen_dir: Path, tmp_path: Path) -> None:
    d = _copy(qwen_dir, tmp_path)
    make_tokenizer("gpt2").backend_tokenizer.save(str(d / TOKENIZER_FILE))
    with pytest.raises(SpecpackError, match="does not match") as err:
        PackTokenizer.load(d)
    assert err.value.expected == "vocab_size 330"
    assert err.value.found == "320 tokens"


@pytest.mark.parametrize(("edit", "message", "found"), [
    (lambda c: "{oops", "is not valid JSON", None),
    (lambda c: json.dumps({**c, "format": "other/9"}), "not a specpack tokenizer config", "'other/9'"),
    (lambda c: json.dumps([1, 2]), "not a specpack tokenizer config", "'list'"),
    (lambda c: json.dumps({k: v for k, v in c.items() if k != "chat_template"}), "is incomplete",
     "missing ['chat_template']"),
    (lambda c: json.dumps({**c, "chat_template": 3}), "wrong type", "chat_template=3"),
    (lambda c: "[" * 100_000 + "]" * 100_000, "is not valid JSON", "JSON nested too deeply to parse"),
])
def test_corrupt_config(qwen_dir: Path, tmp_path: Path, edit: Any, message: str, found: str | None) -> None:
    d = _copy(qwen_dir, tmp_path)
    config = json.loads((d / CONFIG_FILE).read_text())
    (d / CONFIG_FILE).write_text(edit(config))
    with pytest.raises(SpecpackError, match=message) as err:
        PackTokenizer.load(d)
    if found is not None:
        assert err.value.found == found
