"""A loaded pack: checked files, one ONNX Runtime session per model, buffers allocated once."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specpack.deploy.integrity import verify_pack
from specpack.deploy.manifest import Manifest, ModelEntry
from specpack.errors import SpecpackError
from specpack.runtime.buffers import DecodeBuffers
from specpack.runtime.graph_check import check_graph_matches
from specpack.runtime.kv_cache import ConcatKVCache
from specpack.runtime.loop import generate_tokens
from specpack.runtime.ort_engine import OrtDraftEngine, OrtTargetEngine
from specpack.runtime.ort_session import OrtGraph
from specpack.runtime.tokenizer import PackTokenizer
from specpack.validation import PackLimits, check_generate_args, check_load_args, check_prompt


@dataclass
class Generation:
    tokens: list[int]                 # new token ids, ending with the eos id when one ended generation
    text: str                         # their text, special tokens skipped
    stats: dict[str, Any] = field(default_factory=dict)


def load(path: str | os.PathLike[str], *, threads: int | None = None, manifest_sha256: str | None = None) -> Pack:
    """Open a pack: check every file against the manifest, then create the sessions.

    `manifest_sha256` (printed by `specpack inspect`) pins the pack: any other manifest is refused.
    """
    return Pack(Path(check_load_args(path, threads)), threads=threads, manifest_sha256=manifest_sha256)


class Pack:
    def __init__(self, path: Path, *, threads: int | None = None, manifest_sha256: str | None = None) -> None:
        self.path = path
        self.manifest = Manifest.read(path, sha256=manifest_sha256)
        verify_pack(path, self.manifest)
        m = self.manifest
        self.tokenizer = PackTokenizer.load(path / "tokenizer")
        self.buffers = DecodeBuffers.allocate(m.max_len, m.k_max, m.vocab_size)
        self.draft = OrtDraftEngine(*self._model(m.draft, threads))
        self.target = OrtTargetEngine(*self._model(m.target, threads))
        self.eos_ids = frozenset(m.eos_token_ids)

    def _model(self, entry: ModelEntry, threads: int | None) -> tuple[OrtGraph, ConcatKVCache, DecodeBuffers, int]:
        graph = OrtGraph(self.path / entry.graph.path, threads=threads)
        check_graph_matches(entry.graph, graph.session, entry.graph.path)
        dtype = np.float16 if entry.dtype == "fp16" else np.float32
        capacity = self.manifest.max_len + self.manifest.k_max + 1
        cache = ConcatKVCache(2 * entry.num_layers, entry.kv_heads, entry.head_dim, capacity, np.dtype(dtype))
        return graph, cache, self.buffers, entry.num_layers

    def encode(self, prompt: str | Sequence[int], *, chat: bool = False) -> list[int]:
        """Prompt ids: a list of ids as is, a string tokenized as is, or wrapped in the chat template."""
        checked = check_prompt(prompt, chat=chat, vocab_size=self.manifest.vocab_size)
        if isinstance(checked, str):
            return self.tokenizer.encode_chat(checked) if chat else self.tokenizer.encode(checked)
        return checked

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 128, *, k: int | None = None,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 chat: bool = False, on_text: Callable[[str], None] | None = None) -> Generation:
        """Speculative decoding with k drafts per step (default: the pack's k_max; k = 0: the target alone).

        Greedy by default; the output distribution is the target's for any sampling parameters.
        """
        m = self.manifest
        args = check_generate_args(prompt, max_new_tokens, k=k, temperature=temperature, top_k=top_k, top_p=top_p,
                                   seed=seed, chat=chat, on_text=on_text, limits=PackLimits(m.k_max, m.vocab_size, m.max_len))
        prompt, max_new_tokens, params, seed = args.prompt, args.max_new_tokens, args.sampling, args.seed
        k = m.k_max if args.k is None else args.k
        ids = self.encode(prompt, chat=chat)
        self._check_request(len(ids), max_new_tokens, k)
        self.buffers.set_sampling(params)
        rng = None if params.greedy else np.random.Generator(np.random.Philox(seed))
        stream = self.tokenizer.stream() if on_text is not None else None

        def on_tokens(new: list[int]) -> None:
            if stream is not None and on_text is not None:
                for token in new:
                    if text := stream.push(token):
                        on_text(text)

        tokens, stats = generate_tokens(self.draft, self.target, self.buffers, ids,
                                        max_new_tokens, k, self.eos_ids, rng, on_tokens)
        if stream is not None and on_text is not None and (rest := stream.flush()):
            on_text(rest)
        result = stats.to_dict()
        result["prompt_tokens"] = len(ids)
        return Generation(tokens=tokens, text=self.tokenizer.decode(tokens), stats=result)

    def _check_request(self, n_prompt: int, max_new_tokens: int, k: int) -> None:
        m = self.manifest
        if n_prompt == 0:
            raise SpecpackError("empty prompt", expected="at least one token", found="0 tokens")
        if n_prompt + max_new_tokens > m.max_len:
            raise SpecpackError("prompt plus max_new_tokens is longer than the pack's max length",
                                expected=f"prompt + max_new_tokens <= {m.max_len}",
                                found=f"{n_prompt} + {max_new_tokens} = {n_prompt + max_new_tokens}",
                                hint="shorten the prompt, lower --max-new-tokens, or re-export with a larger --max-len")

    def close(self) -> None:
        self.draft.close()
        self.target.close()
