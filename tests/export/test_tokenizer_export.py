"""write_tokenizer: the files it writes, what the record says, the eos union, and the parity check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, pre_tokenizers

from specpack.errors import SpecpackError
from specpack.export.tokenizer_export import check_parity, eos_token_ids, write_tokenizer
from specpack.runtime.tokenizer import CONFIG_FORMAT, PackTokenizer
from tests.tiny import CHATML_TEMPLATE, FAMILIES, make_tokenizer

FILES = ["tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"]


def _model_dir(tmp_path: Path, family: str, **json_files: dict[str, Any]) -> Path:
    """A model folder with the family's tiny tokenizer and the given JSON files (config.json, ...)."""
    d = tmp_path / "model"
    make_tokenizer(family).save_pretrained(d)
    for name, data in json_files.items():
        (d / f"{name}.json").write_text(json.dumps(data))
    return d


@pytest.mark.parametrize("family", FAMILIES)
def test_record_and_files(tmp_path: Path, family: str) -> None:
    from transformers import AutoTokenizer

    model = _model_dir(tmp_path, family)
    record = write_tokenizer(model, tmp_path / "pack")
    hf = AutoTokenizer.from_pretrained(model)
    assert record.files == FILES
    assert all((tmp_path / "pack" / f).is_file() for f in record.files)
    assert record.vocab_size == len(hf)
    assert record.has_chat_template == (family != "gpt2")  # the tiny gpt2 tokenizer has no template
    assert record.eos_token_ids == [hf.eos_token_id]
    written = json.loads((tmp_path / "pack" / FILES[0]).read_text())
    assert written == json.loads(hf.backend_tokenizer.to_str())


def test_config_holds_what_the_runtime_needs(tmp_path: Path) -> None:
    write_tokenizer(_model_dir(tmp_path, "qwen2"), tmp_path / "pack")
    config = json.loads((tmp_path / "pack" / FILES[1]).read_text())
    assert config["format"] == CONFIG_FORMAT
    assert config["chat_template"] == CHATML_TEMPLATE
    assert config["chat_templates"] == {}
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == (None, "<|im_end|>", "<|endoftext|>")
    assert config["special_tokens_map"] == {"eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
                                            "pad_token": "<|endoftext|>"}
    assert config["add_special_tokens"] is True
    assert config["split_special_tokens"] is False
    assert config["clean_up_tokenization_spaces"] is False
    assert config["vocab_size"] == 330


def test_backend_not_the_models_file(tmp_path: Path) -> None:
    """transformers rebuilds Qwen2's pre-tokenizer whatever the model's tokenizer.json says; the pack follows
    transformers, where a copied tokenizer.json would split digits differently."""
    from transformers import AutoTokenizer

    model = _model_dir(tmp_path, "qwen2")
    raw = Tokenizer.from_file(str(model / "tokenizer.json"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # GPT-2's digit runs
    raw.save(str(model / "tokenizer.json"))
    write_tokenizer(model, tmp_path / "pack")
    hf, tok = AutoTokenizer.from_pretrained(model), PackTokenizer.load(tmp_path / "pack" / "tokenizer")
    text = "x = 1234567890"
    assert tok.encode(text) == hf(text)["input_ids"]
    assert raw.encode(text).ids != hf(text)["input_ids"]


def test_eos_ids_are_the_union_of_all_three(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, "qwen2", config={"eos_token_id": 7},
                       generation_config={"eos_token_id": [2, 11, 7], "bos_token_id": 1})
    assert write_tokenizer(model, tmp_path / "pack").eos_token_ids == [2, 7, 11]  # tokenizer's <|im_end|> is 2


def test_eos_ids_from_text_config_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"eos_token_id": [5, 3]}}))
    assert eos_token_ids(tmp_path, None) == [3, 5]
    assert eos_token_ids(tmp_path / "nowhere", 4) == [4]


@pytest.mark.parametrize("bad", ["</s>", [1, None], True, -1])
def test_invalid_eos_id(tmp_path: Path, bad: object) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": bad}))
    with pytest.raises(SpecpackError, match="invalid eos_token_id") as err:
        eos_token_ids(tmp_path, 2)
    assert err.value.found == repr(bad)


def test_unreadable_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(SpecpackError, match=r"config\.json is not valid JSON"):
        eos_token_ids(tmp_path, 2)


def test_named_templates_keep_all_and_use_default(tmp_path: Path) -> None:
    tok = make_tokenizer("qwen2")
    tok.chat_template = {"default": CHATML_TEMPLATE, "rag": "{{ 'rag' }}"}
    tok.save_pretrained(tmp_path / "model")
    assert write_tokenizer(tmp_path / "model", tmp_path / "pack").has_chat_template
    config = json.loads((tmp_path / "pack" / FILES[1]).read_text())
    assert config["chat_template"] == CHATML_TEMPLATE
    assert config["chat_templates"] == {"default": CHATML_TEMPLATE, "rag": "{{ 'rag' }}"}


def test_named_templates_without_default(tmp_path: Path) -> None:
    tok = make_tokenizer("qwen2")
    tok.chat_template = {"rag": "{{ 'rag' }}", "tool_use": "{{ 'tools' }}"}
    tok.save_pretrained(tmp_path / "model")
    assert not write_tokenizer(tmp_path / "model", tmp_path / "pack").has_chat_template
    pack_tok = PackTokenizer.load(tmp_path / "pack" / "tokenizer")
    with pytest.raises(SpecpackError, match="no chat template") as err:
        pack_tok.encode_chat("hi")
    assert err.value.found == "templates named ['rag', 'tool_use'], none of them 'default'"
    assert pack_tok.render_chat([{"role": "user", "content": "hi"}], tools=[{"name": "f"}]) == "tools"


def test_model_without_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(SpecpackError, match="cannot load the tokenizer") as err:
        write_tokenizer(tmp_path, tmp_path / "pack")
    assert err.value.expected == "a model directory with tokenizer.json or tokenizer_config.json"


def test_parity_check_catches_a_tokenizer_that_disagrees(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    write_tokenizer(_model_dir(tmp_path, "gpt2"), tmp_path / "pack")
    make_tokenizer("qwen2").save_pretrained(tmp_path / "qwen2")
    with pytest.raises(SpecpackError, match="disagrees with transformers: ids of"):
        check_parity(AutoTokenizer.from_pretrained(tmp_path / "qwen2"), PackTokenizer.load(tmp_path / "pack" / "tokenizer"))
