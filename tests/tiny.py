"""Tiny random causal LMs with real family tokenizers, built at test time (nothing is downloaded).

`make_pair(family, root, draft="small")` writes a draft and a target model directory, each a
`save_pretrained` folder with config, weights, generation config and tokenizer, as a hub model has.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

FAMILIES = ("llama", "qwen2", "mistral", "gpt2")
DraftKind = Literal["small", "same", "noisy"]

_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "for i in range(10):\n    print(i * i)",
    "Speculative decoding: a draft proposes, the target verifies.",
    "Hello world! How are you today? 1234567890",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)",
    "Ünïcödé tèxt, emoji 🙂 and tabs\tand newlines\n\n",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] | trim + ' [/INST]' }}{% else %}{{ ' ' + message['content'] | trim + eos_token }}"
    "{% endif %}{% endfor %}"
)


def _train_bpe(vocab_size: int, specials: list[str], byte_level: bool) -> tuple[dict[str, int], list[tuple[str, str]]]:
    tok = Tokenizer(models.BPE(unk_token=None if byte_level else "<unk>"))
    if byte_level:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        alphabet = sorted({c for text in _CORPUS for c in text.replace(" ", "▁")})
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    data = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in data["merges"]]
    return tok.get_vocab(), merges


def make_tokenizer(family: str):  # -> transformers PreTrainedTokenizerBase
    """A small tokenizer of the family's own transformers class (so its own pre-tokenizer applies)."""
    from transformers import GPT2TokenizerFast, LlamaTokenizerFast, Qwen2TokenizerFast

    if family == "gpt2":
        vocab, merges = _train_bpe(320, ["<|endoftext|>"], byte_level=True)
        return GPT2TokenizerFast(vocab=vocab, merges=merges)
    if family == "qwen2":
        vocab, merges = _train_bpe(330, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], byte_level=True)
        tok = Qwen2TokenizerFast(vocab=vocab, merges=merges, eos_token="<|im_end|>", pad_token="<|endoftext|>")
        tok.chat_template = CHATML_TEMPLATE
        return tok
    if family in ("llama", "mistral"):
        vocab, merges = _train_bpe(300, ["<unk>", "<s>", "</s>"], byte_level=False)
        tok = LlamaTokenizerFast(vocab=vocab, merges=merges)
        tok.chat_template = LLAMA_TEMPLATE
        return tok
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


def make_config(family: str, vocab_size: int, *, layers: int, hidden: int, heads: int, kv_heads: int,
                head_dim: int, max_positions: int, eos_token_id: int, bos_token_id: int | None):
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    if family == "gpt2":
        return GPT2Config(vocab_size=vocab_size, n_embd=heads * head_dim, n_head=heads, n_layer=layers,
                          n_positions=max_positions, eos_token_id=eos_token_id, bos_token_id=eos_token_id)
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[family]
    return cls(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
               max_position_embeddings=max_positions, eos_token_id=eos_token_id, bos_token_id=bos_token_id,
               tie_word_embeddings=False)


def make_model(family: str, out: Path, *, layers: int = 2, heads: int = 4, kv_heads: int = 2, head_dim: int = 12,
               max_positions: int = 256, seed: int = 0, pad_rows: int = 0, tokenizer=None) -> Path:
    """Write a tiny random model of `family` to `out` (config, weights, generation config, tokenizer)."""
    from transformers import AutoModelForCausalLM

    tok = tokenizer if tokenizer is not None else make_tokenizer(family)
    config = make_config(family, len(tok) + pad_rows, layers=layers, hidden=heads * head_dim, heads=heads,
                         kv_heads=kv_heads, head_dim=head_dim, max_positions=max_positions,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # sharper than the default init, so greedy text is not a near-tie everywhere
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    model.eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def perturb_copy(src: Path, out: Path, scale: float, seed: int = 1) -> Path:
    """A copy of `src` with Gaussian noise on every weight: a draft that agrees often but not always."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std())
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


def make_pair(family: str, root: Path, draft: DraftKind = "small", *, head_dim: int = 12,
              max_positions: int = 256, pad_rows: int = 0) -> tuple[Path, Path]:
    """(draft_dir, target_dir): draft smaller ("small"), identical ("same") or a perturbed copy ("noisy")."""
    tok = make_tokenizer(family)
    target = make_model(family, root / f"{family}-target", layers=3, heads=4, kv_heads=2, head_dim=head_dim,
                        max_positions=max_positions, seed=0, pad_rows=pad_rows, tokenizer=tok)
    draft_dir = root / f"{family}-draft-{draft}"
    if draft == "same":
        shutil.copytree(target, draft_dir)
    elif draft == "noisy":
        perturb_copy(target, draft_dir, scale=0.05)
    else:
        make_model(family, draft_dir, layers=1, heads=2, kv_heads=1, head_dim=head_dim,
                   max_positions=max_positions, seed=1, tokenizer=tok)
    return draft_dir, target


def qwen2_gguf_writer(path: Path, name: str, *, layers: int, hidden: int, heads: int, kv_heads: int,
                      ffn: int, arch: str = "qwen2"):  # -> (gguf.GGUFWriter, vocabulary size)
    """A GGUF writer for a tiny Qwen2 (or another `arch` with the same metadata keys) with its metadata and the tiny
    Qwen2 tokenizer set; the caller adds the tensors and writes the file."""
    import gguf

    tok = json.loads(make_tokenizer("qwen2").backend_tokenizer.to_str())
    vocab: dict[str, int] = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    specials = {t["content"] for t in tok["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name)
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_pad_token_id(vocab["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)
    return w, len(tokens)
