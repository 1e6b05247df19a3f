"""The transformers side of the bench, always in a child process (its memory is not ours, nor added to ours):

    python -m specpack.bench.peer_hf gaps IN.json OUT.json   top-2 logit gap of the target where outputs diverged
    python -m specpack.bench.peer_hf peer IN.json OUT.json   generate() and assisted generation on the prompts

The parent side (`logit_gaps`, `run_hf_peer`) imports neither torch nor transformers; the model dirs are the
`resolved` paths of the manifest's source records, used only when their files match the sha256 recorded at export
(`source_mismatch`). Missing dirs or packages, or other models, give a note, not an error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specpack.bench.memory import peak_rss_kb
from specpack.dtypes import GRAPH_DTYPES
from specpack.hashing import sha256_file

if TYPE_CHECKING:
    from specpack.bench.runner import BenchRun

WARMUP_TOKENS = 8
TIMING = ("decode_s = generate() wall time - ttft_s, where ttft_s is the wall time of a 1-token generate() of the "
          "target alone on the same prompt (assisted generation emits its first tokens only after a draft round, "
          "so a streamer's first timestamp is not its time to first token); decoded_tokens = new tokens - 1")


# --- parent side -------------------------------------------------------------------------------------------

def logit_gaps(target_dir: str | None, requests: list[dict[str, Any]], *, threads: int,
               dtype: str) -> tuple[list[dict[str, Any]], str | None]:
    """[{prompt, position, gap, top2_tokens, top2_logits}] for each request {prompt, position, prefix}."""
    why = _unavailable(target_dir)
    if why:
        return [], f"divergence logit gaps not computed: {why}"
    out = _call_child("gaps", {"target": target_dir, "threads": threads, "dtype": dtype, "requests": requests})
    if "error" in out:
        return [], f"divergence logit gaps not computed: {out['error']}"
    return out["gaps"], None


def run_hf_peer(draft_dir: str | None, target_dir: str | None, run: BenchRun, *,
                threads: int) -> tuple[dict[str, Any] | None, str | None]:
    """transformers' greedy generate and assisted generation on the run's prompts, per-prompt records."""
    why = _unavailable(target_dir) or _unavailable(draft_dir)
    if why:
        return None, f"--peer hf skipped: {why}"
    if not run.config.greedy:
        return None, "--peer hf skipped: it compares greedy outputs (use --temperature 0)"
    prompts = [{"id": r.prompt.id, "category": r.prompt.category, "text": r.prompt.text, "chat": r.prompt.chat,
                "ids": r.ids} for r in run.runs]
    out = _call_child("peer", {"draft": draft_dir, "target": target_dir, "threads": threads,
                               "dtype": run.pack["dtype"], "max_new_tokens": run.config.max_new_tokens,
                               "eos_token_ids": run.pack["eos_token_ids"], "prompts": prompts})
    if "error" in out:
        return None, f"--peer hf failed: {out['error']}"
    return out, None


def _unavailable(model_dir: str | None) -> str | None:
    """Why the HF model at `model_dir` cannot be loaded here, or None."""
    for package in ("torch", "transformers"):
        if importlib.util.find_spec(package) is None:
            return f"{package} is not installed (pip install 'specpack[export]')"
    if not model_dir:
        return "the manifest records no resolved source directory"
    if not (Path(model_dir) / "config.json").is_file():
        return f"the source model directory {model_dir} is not here"
    return None


def source_mismatch(record: Mapping[str, Any]) -> str | None:
    """Why the model at a source record's `resolved` dir is not the one the pack was exported from (a file missing
    or not of its recorded sha256), or None (also when the dir is not here: `_unavailable` says so)."""
    model_dir, files = record.get("resolved"), record.get("files") or {}
    if not model_dir or not (Path(model_dir) / "config.json").is_file():
        return None
    if not files:
        return f"{model_dir}: the manifest records no sha256 of its files"
    for name, digest in sorted(files.items()):
        path = Path(model_dir) / name
        if name.endswith(".gguf") and not path.exists():
            continue  # the GGUF file a converted dir came from, recorded too; the dir's own files are checked
        if not path.is_file():
            return f"{model_dir}: {name} is missing"
        if sha256_file(path) != digest:
            return f"{model_dir}: {name} is not the file the pack was exported from (sha256 differs)"
    return None


def _call_child(command: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Run this module in a fresh interpreter; its stderr shows through; returns its JSON or {"error"}."""
    with tempfile.TemporaryDirectory(prefix="specpack-bench-") as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps(payload))
        proc = subprocess.run([sys.executable, "-m", "specpack.bench.peer_hf", command, str(src), str(dst)],
                              stdout=subprocess.DEVNULL, check=False)
        if proc.returncode != 0 or not dst.is_file():
            return {"error": f"the child process exited with status {proc.returncode} (its stderr is above)"}
        result: dict[str, Any] = json.loads(dst.read_text())
        return result


# --- child side: torch and transformers are imported only below, in the child ------------------------------

def _load(model_dir: str, dtype: str, threads: int) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, GRAPH_DTYPES[dtype].torch)).eval()
    model.generation_config = GenerationConfig()  # plain greedy: no repetition penalty or hub sampling defaults
    return model


def gaps_main(payload: dict[str, Any]) -> dict[str, Any]:
    import torch

    model = _load(payload["target"], payload["dtype"], payload["threads"])
    gaps = []
    with torch.inference_mode():
        for r in payload["requests"]:
            logits = model(torch.tensor([r["prefix"]])).logits[0, -1].float()  # [V]
            top = torch.topk(logits, 2)
            gaps.append({"prompt": r["prompt"], "position": r["position"],
                         "gap": float(top.values[0] - top.values[1]),
                         "top2_tokens": top.indices.tolist(), "top2_logits": top.values.tolist()})
    return {"gaps": gaps, "dtype": payload["dtype"]}


def peer_main(payload: dict[str, Any]) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import AutoTokenizer

    threads, dtype = payload["threads"], payload["dtype"]
    tokenizer = AutoTokenizer.from_pretrained(payload["target"])
    target, draft = _load(payload["target"], dtype, threads), _load(payload["draft"], dtype, threads)
    eos, max_new = payload["eos_token_ids"], payload["max_new_tokens"]
    prompts = payload["prompts"]
    records = []
    with torch.inference_mode():
        first = _hf_ids(tokenizer, prompts[0]["text"], prompts[0]["chat"])
        _generate(target, first, WARMUP_TOKENS, eos, None)
        _generate(target, first, WARMUP_TOKENS, eos, draft)
        for i, p in enumerate(prompts):
            print(f"[bench peer hf] {i + 1}/{len(prompts)} {p['id']}", file=sys.stderr, flush=True)
            ids = _hf_ids(tokenizer, p["text"], p["chat"])
            ttft = _generate(target, ids, 1, eos, None)[1]  # prompt in -> first token out, the target alone
            records.append({"id": p["id"], "category": p["category"], "same_input_ids": ids == p["ids"],
                            "ar": _decode_record(*_generate(target, ids, max_new, eos, None), ttft),
                            "assisted": _decode_record(*_generate(target, ids, max_new, eos, draft), ttft)})
    return {"dtype": dtype, "threads": threads, "transformers": transformers.__version__, "torch": torch.__version__,
            "assistant": _assistant_settings(draft), "timing": TIMING,
            "peak_rss_mb": peak_rss_kb() / 1024, "prompts": records}  # this child's own, not its parent's


def _hf_ids(tokenizer: Any, text: str, chat: bool) -> list[int]:
    """The prompt as a transformers user writes it: the chat template rendered, then encoded without specials."""
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])


def _generate(model: Any, ids: Sequence[int], max_new_tokens: int, eos: list[int],
              assistant: Any) -> tuple[list[int], float]:
    """Greedy generate (assisted when `assistant` is a model): the new tokens and the wall time."""
    import torch

    t0 = time.perf_counter()
    out = model.generate(input_ids=torch.tensor([list(ids)]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos[0],
                         assistant_model=assistant)
    return out[0, len(ids):].tolist(), time.perf_counter() - t0


def _decode_record(tokens: list[int], total_s: float, ttft_s: float) -> dict[str, Any]:
    return {"tokens": tokens, "new_tokens": len(tokens), "ttft_s": ttft_s, "decode_s": max(total_s - ttft_s, 0.0),
            "decoded_tokens": max(len(tokens) - 1, 0)}


def _assistant_settings(draft: Any) -> dict[str, Any]:
    """The assisted-generation settings in effect: the draft's generation config, else transformers' defaults."""
    gen = draft.generation_config
    defaults: dict[str, Any] = getattr(gen, "_get_default_generation_params", dict)()
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    return {key: getattr(gen, key, None) if getattr(gen, key, None) is not None else defaults.get(key) for key in keys}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specpack.bench.peer_hf")
    parser.add_argument("command", choices=("gaps", "peer"))
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    args = parser.parse_args(argv)
    payload = json.loads(args.src.read_text())
    result = gaps_main(payload) if args.command == "gaps" else peer_main(payload)
    args.dst.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
