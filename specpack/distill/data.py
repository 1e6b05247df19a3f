"""The training data: sources in, one token stream + loss mask out, each part recorded with its sha256.

    --data FILE          a text file (trained on whole), or a bench prompt file (its first line a JSON record in
                         specpack/prompts.py's formats: the target answers each prompt, the answers are trained on);
                         "text:FILE" / "prompts:FILE" force the kind
    default recipe       (no --data) stdlib: Python's standard library sources of this interpreter, files sorted by
                         path, up to stdlib_tokens tokens; self: seed_prompts.py's prompts answered by the target
                         (half greedy, half sampled at temperature 0.7), loss on the answers only; self-instruct:
                         requests the target wrote itself (self_instruct.py), answered the same way

Parts are concatenated, each document followed by an end token; training windows are cut from the stream
(trainer.py). A part's sha256 is over its token ids as little-endian int32 (what training saw), as the calibration
record does. The built corpus is saved in HEAD/ckpt/ so a resumed run reads it instead of generating it again.
"""

from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specpack.bounded_read import read_bounded
from specpack.distill import self_instruct
from specpack.distill.config import DistillConfig
from specpack.distill.seed_prompts import seed_prompts, templates_sha256
from specpack.errors import SpecpackError
from specpack.limits import PROMPT_SET_BYTES

SAMPLED_TEMPERATURE = 0.7
CORPUS_FILE, CORPUS_RECORD, CORPUS_KEY = "corpus.npz", "corpus.json", "corpus.key.json"


@dataclass(frozen=True)
class Part:
    """One source's tokens: ids int32 [N]; mask uint8 [N], 1 where predicting that token is trained."""

    name: str
    ids: np.ndarray
    mask: np.ndarray
    info: dict[str, Any]

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "tokens": int(self.ids.size), "loss_tokens": int(self.mask.sum()),
                "sha256": ids_sha256(self.ids), **self.info}


@dataclass(frozen=True)
class Corpus:
    ids: np.ndarray    # int32 [N] every part, in order
    mask: np.ndarray   # uint8 [N]
    parts: list[dict[str, Any]]  # Part.record() of each

    def save(self, folder: Path, key: dict[str, Any] | None = None) -> None:
        """key: what the corpus was built from (recipe, data files, seed, target hash): a later run with the same key
        reads it instead of building it again (a new head with other optimizer settings on the same data)."""
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / CORPUS_FILE, ids=self.ids, mask=self.mask)
        (folder / CORPUS_RECORD).write_text(json.dumps(self.parts, indent=1), encoding="utf-8")
        if key is not None:
            (folder / CORPUS_KEY).write_text(json.dumps(key, sort_keys=True), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path, key: dict[str, Any] | None = None) -> Corpus | None:
        """The saved corpus; with `key`, only if it was saved with that very key (None otherwise)."""
        if not (folder / CORPUS_FILE).is_file() or not (folder / CORPUS_RECORD).is_file():
            return None
        if key is not None:
            saved = folder / CORPUS_KEY
            if not saved.is_file() or json.loads(saved.read_text(encoding="utf-8")) != json.loads(json.dumps(key)):
                return None
        with np.load(folder / CORPUS_FILE) as z:
            return cls(z["ids"], z["mask"], json.loads((folder / CORPUS_RECORD).read_text(encoding="utf-8")))


def ids_sha256(ids: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()


def uses_default_recipe(config: DistillConfig) -> bool:
    """The default sources are added unless --data names text or prompt files (an earlier corpus, corpus:DIR, adds to
    them: a recipe run again with another --seed writes new requests, and the two corpora train one head)."""
    return config.default_recipe and all(_kind_prefix(spec) == "corpus" for spec in config.data)


def recipe(config: DistillConfig) -> dict[str, Any]:
    """What the head's record says about where its data came from."""
    sources = [*config.data, *(["stdlib", "self", "self-instruct"] if uses_default_recipe(config) else [])]
    return {"sources": sources, "stdlib_tokens": config.stdlib_tokens, "self_prompts": config.self_prompts,
            "self_instruct": config.self_instruct, "answer_tokens": config.answer_tokens,
            "answers": f"half greedy, half sampled at T {SAMPLED_TEMPERATURE}",
            "generation_batch": config.generation_batch,  # the sampled answers' seeds follow the batches
            "generation_attention": "grouped decode (specpack/distill/grouped_attention.py)",
            "seed_templates_sha256": templates_sha256(),
            "self_instruct_templates_sha256": self_instruct.templates_sha256(),
            "requests": f"sampled at T {self_instruct.REQUEST_TEMPERATURE}, up to {self_instruct.REQUEST_TOKENS} tokens",
            "never": "Spec-Bench, MT-bench, HumanEval, GSM8K, ShareGPT"}


def build_corpus(config: DistillConfig, model: Any, tokenizer: Any, target_sha256: str) -> Corpus:
    """Every source of the recipe, tokenized (and answered by `model` where it is a prompt source); an earlier corpus
    (corpus:DIR) only if it was built from this very target (its key's target_sha256)."""
    eos = _eos(tokenizer)
    parts: list[Part] = []
    for spec in config.data:
        kind, path = _data_kind(spec)
        if kind == "corpus":
            parts.append(_earlier_corpus(path, target_sha256))
        elif kind == "text":
            text = read_bounded(path, PROMPT_SET_BYTES, "data file").decode("utf-8", errors="replace")
            ids = np.asarray([*tokenizer.encode(text, add_special_tokens=False), eos], dtype=np.int32)
            parts.append(Part(f"text:{path.name}", ids, np.ones_like(ids, dtype=np.uint8), {"file": str(path)}))
        else:
            from specpack.prompts import read_prompts

            prompts = [(p.text, p.chat) for p in read_prompts([path])]
            parts.append(_answered(f"prompts:{path.name}", prompts, model, tokenizer, config, {"file": str(path)}))
    if uses_default_recipe(config):
        if config.stdlib_tokens:
            parts.append(_stdlib(tokenizer, config.stdlib_tokens, eos))
        if config.self_prompts:
            prompts = [(text, True) for text in seed_prompts(config.self_prompts, config.seed)]
            parts.append(_answered("self", prompts, model, tokenizer, config, {"templates_sha256": templates_sha256()}))
        if config.self_instruct:
            requests = self_instruct.write_requests(config.self_instruct, config.seed, model, tokenizer,
                                                    config.generation_batch, eos)
            parts.append(_answered("self-instruct", [(text, True) for text in requests], model, tokenizer, config,
                                   {"templates_sha256": self_instruct.templates_sha256(), "requests": len(requests)}))
    parts = [p for p in _without_repeats(parts) if p.ids.size]
    if not parts or sum(int(p.mask.sum()) for p in parts) < config.seq_len:
        raise SpecpackError("not enough training data", expected=f"at least --seq-len ({config.seq_len}) trained tokens",
                            found=f"{sum(int(p.mask.sum()) for p in parts)} tokens from {len(parts)} sources",
                            hint="add --data files, or lower --seq-len")
    return Corpus(np.concatenate([p.ids for p in parts]), np.concatenate([p.mask for p in parts]),
                  [p.record() for p in parts])


def _without_repeats(parts: list[Part]) -> list[Part]:
    """The parts less any whose tokens an earlier corpus (corpus:DIR) already holds as one of its parts: the default
    recipe's stdlib part is the same text every run, and accumulated data should not count it twice."""
    held: set[str] = set()
    for part in parts:
        if part.name.startswith("corpus:"):
            held |= _part_hashes(part.info.get("parts", []))
    return [p for p in parts if p.name.startswith("corpus:") or ids_sha256(p.ids) not in held]


def _part_hashes(records: list[dict[str, Any]]) -> set[str]:
    """The sha256 of every part record, nested ones (an earlier corpus's own earlier corpus) included."""
    hashes: set[str] = set()
    for record in records:
        hashes.add(str(record.get("sha256")))
        hashes |= _part_hashes(record.get("parts", []))
    return hashes


def _kind_prefix(spec: str) -> str:
    """The kind a --data value names (text:, prompts:, corpus:), or "" for a bare path."""
    kind, _, rest = spec.partition(":")
    return kind if kind in ("text", "prompts", "corpus") and rest else ""


def _earlier_corpus(folder: Path, target_sha256: str) -> Part:
    """An earlier run's corpus (HEAD/ckpt/: corpus.npz, corpus.json, corpus.key.json) as one part, its parts' records
    kept; refused unless its key names this target (its answers are that target's text, its ids that tokenizer's)."""
    corpus = Corpus.load(folder)
    key_file = folder / CORPUS_KEY
    if corpus is None or not key_file.is_file():
        raise SpecpackError(f"no saved corpus in {folder}", expected=f"{CORPUS_FILE}, {CORPUS_RECORD}, {CORPUS_KEY}",
                            found="missing files", hint="corpus:DIR takes an earlier distill run's HEAD/ckpt folder")
    found = json.loads(key_file.read_text(encoding="utf-8")).get("target_sha256")
    if found != target_sha256:
        raise SpecpackError(f"the corpus in {folder} was built from another target",
                            expected=f"target weights sha256 {target_sha256[:16]}...",
                            found=f"{str(found)[:16]}...", hint="build a corpus from this target (drop corpus:DIR)")
    return Part(f"corpus:{folder.name}", corpus.ids, corpus.mask, {"dir": str(folder), "parts": corpus.parts})


def _data_kind(spec: str) -> tuple[str, Path]:
    """("text" | "prompts" | "corpus", path) of one --data value."""
    kind, _, rest = spec.partition(":")
    if kind == "corpus" and rest:
        path = Path(rest).expanduser()
        if not path.is_dir():
            raise SpecpackError(f"--data corpus folder not found: {path}", expected="an earlier run's HEAD/ckpt folder",
                                found="no such folder", hint="corpus:DIR, DIR holding corpus.npz")
        return kind, path
    if kind in ("text", "prompts") and rest:
        path = Path(rest).expanduser()
    else:
        kind, path = "", Path(spec).expanduser()
    if not path.is_file():
        raise SpecpackError(f"--data file not found: {path}", expected="a text file or a bench prompt file",
                            found="no such file", hint="text:FILE / prompts:FILE force the kind")
    if not kind:
        head = read_bounded(path, PROMPT_SET_BYTES, "data file")[:1 << 16].decode("utf-8", errors="replace")
        first = next((line for line in head.splitlines() if line.strip()), "")
        try:
            kind = "prompts" if isinstance(json.loads(first), dict) else "text"
        except ValueError:
            kind = "text"
    return kind, path


def _stdlib(tokenizer: Any, budget: int, eos: int) -> Part:
    """Python's standard library sources, files sorted by path, until `budget` tokens."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[np.ndarray] = []
    total, files = 0, 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("site-packages/", "dist-packages/")):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = np.asarray([*tokenizer.encode(text, add_special_tokens=False), eos], dtype=np.int32)
        chunks.append(ids[: budget - total])
        total += chunks[-1].size
        files += 1
        if total >= budget:
            break
    ids = np.concatenate(chunks) if chunks else np.zeros(0, np.int32)
    return Part("stdlib", ids, np.ones_like(ids, dtype=np.uint8), {"root": str(root), "files": files})


def _answered(name: str, prompts: list[tuple[str, bool]], model: Any, tokenizer: Any, config: DistillConfig,
              info: dict[str, Any]) -> Part:
    """The target's answers to `prompts`: prompt tokens (mask 0) + answer tokens (mask 1) + end token, per prompt.
    Prompt i is answered greedily when i is even, sampled at SAMPLED_TEMPERATURE when odd (seeded)."""
    import torch

    eos = _eos(tokenizer)
    encoded = [encode_prompt(tokenizer, text, chat) for text, chat in prompts]
    answers: dict[int, list[int]] = {}
    began = time.monotonic()
    for sampled in (False, True):
        chosen = [i for i in range(len(encoded)) if (i % 2 == 1) == sampled]
        for start in range(0, len(chosen), config.generation_batch):
            batch = chosen[start:start + config.generation_batch]
            torch.manual_seed(config.seed * 1_000_003 + batch[0])
            temperature = SAMPLED_TEMPERATURE if sampled else None
            for i, answer in zip(batch, generate(model, [encoded[i] for i in batch], config.answer_tokens, temperature,
                                                  eos), strict=True):
                answers[i] = answer
            log_progress(f"{name}: {len(answers)} of {len(encoded)} prompts answered", began)
    ids: list[int] = []
    mask: list[int] = []
    for i, prompt in enumerate(encoded):
        answer = answers[i]
        ids += [*prompt, *answer, eos]
        mask += [0] * len(prompt) + [1] * (len(answer) + 1)
    return Part(name, np.asarray(ids, np.int32), np.asarray(mask, np.uint8),
                {**info, "prompts": len(prompts), "answer_tokens": config.answer_tokens})


def encode_prompt(tokenizer: Any, text: str, chat: bool) -> list[int]:
    if chat and getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]
        return [int(t) for t in out]
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


def generate(model: Any, prompts: list[list[int]], new_tokens: int, temperature: float | None, eos: int
             ) -> list[list[int]]:
    """Answers (up to the first end token, excluded) to a batch of prompts, left-padded; greedy when temperature is
    None, else sampled from the full distribution at that temperature (torch's generator, seeded by the caller)."""
    import torch

    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), eos, dtype=torch.int64)
    attention = torch.zeros((len(prompts), width), dtype=torch.int64)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        attention[row, width - len(p):] = 1
    options = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature is not None \
        else {"do_sample": False}
    try:
        with torch.no_grad():
            out = model.generate(input_ids=ids.to(device), attention_mask=attention.to(device),
                                 max_new_tokens=new_tokens, min_new_tokens=1, pad_token_id=eos, eos_token_id=eos, **options)
    except torch.OutOfMemoryError as error:
        raise SpecpackError("out of GPU memory while the target wrote training data",
                            expected=f"{len(prompts)} prompts of up to {width} tokens answered at once "
                                     f"(up to {new_tokens} new tokens each)",
                            found=str(error).splitlines()[0],
                            hint="lower --generation-batch (the cache grows with it)") from error
    answers = []
    for row in out[:, width:].tolist():
        answers.append(row[: row.index(eos)] if eos in row else row)
    return answers


def log_progress(what: str, began: float) -> None:
    """One line per batch of generation (building the data takes minutes on a GPU, hours on a CPU)."""
    print(f"[distill] {what} ({time.monotonic() - began:.0f} s)", file=sys.stderr, flush=True)


def _eos(tokenizer: Any) -> int:
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
    if eos is None:
        raise SpecpackError("the target's tokenizer has no end token", expected="eos_token_id or pad_token_id",
                            found="neither", hint="set eos_token in the tokenizer config")
    return int(eos)
