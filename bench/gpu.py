"""The GPU benchmark: the cuda backend's step times at Qwen2.5 shapes (random weights), and the real pair end to end.

    python bench/gpu.py --work /tmp/gpuwork --tokenizer DIR --json bench/results/gpu-CARD.json [--phases ...]

Phases (each writes its part of the JSON as soon as it ends; a failing phase records its error and the next runs):
    card      the card's name (as the GPU reports it), driver, ONNX Runtime version, device-to-device copy
              bandwidth through torch (bytes read + written over time, median of 20 copies of 4 GiB)
    shapes    random-weight Qwen2.5 models at the 0.5B / 1.5B / 7B shapes (fp16), exported as packs with the
              static KV cache (GroupQueryAttention), draft 0.5B; per target: autoregressive step, draft step,
              verify for k = 1..8 (bench/timing.py through the cuda backend), CUDA graphs on and off; c, v(k);
              bandwidth_fraction = weight bytes read per step / step time / copy bandwidth
    real      the real pair (GGUF, --draft-gguf / --target-gguf) exported fp16 static, `specpack bench` on
              4 HumanEval + 4 MT-bench prompts (--prompts), 128 new tokens, greedy, through the cuda backend,
              with NVML energy per token; speedup, predicted_speedup, tokens/s
    genai_pack  the same with the model builder's graphs (spec-export --graphs builder --dtype fp16 --ep cuda)
    genai     onnxruntime-genai on the same prompts; hf: transformers bf16 generate and assisted generation
    divergences  where a configuration's greedy tokens left autoregressive decoding's: the target's top-2
              logit gap there (fp32, transformers)
    summary   the top-level fields, from genai_pack where it ran, else real
Time depends on the shapes, not on the weight values: acceptance comes from the real pair.
The tokenizer directory (--tokenizer) gives the random models a real vocabulary (Qwen2.5's, 151,936 rows).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

SHAPES: dict[str, dict[str, Any]] = {  # Qwen2.5 configs (the 7B's vocabulary is 152,064; 151,936 here, as the draft's)
    "0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864, "tie_word_embeddings": True},
    "1.5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "intermediate_size": 8960, "tie_word_embeddings": True},
    "7b": {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
           "intermediate_size": 18944, "tie_word_embeddings": False},
}
VOCAB = 151936
MAX_LEN = 1024
K_MAX = 8
CONTEXT = 128
PACK_DIRS = {"real": "pack-real", "genai_pack": "pack-genai"}  # phase -> its pack's folder under --work


def pack_dir_of(args: argparse.Namespace, phase: str) -> Path:
    """The folder of `phase`'s pack under --work; --quantize int4 packs get their own (pack-genai-int4)."""
    suffix = "" if args.quantize == "none" else f"-{args.quantize}"
    return Path(args.work) / f"{PACK_DIRS[phase]}{suffix}"


def log(*args: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *args, file=sys.stderr, flush=True)


def card() -> dict[str, Any]:
    import onnxruntime as ort
    import torch

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    n = 1 << 30  # 1 GiB of fp32 = 4 GiB
    src, dst = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    times = []
    for i in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    copy_s = statistics.median(times)
    return {"device": torch.cuda.get_device_name(0), "nvidia_smi": smi, "onnxruntime": ort.__version__,
            "providers": ort.get_available_providers(), "torch": torch.__version__,
            "copy_bandwidth_gb_s": 2 * 4 * n / copy_s / 1e9}


def make_model(shape: str, out: Path, tokenizer: Path) -> dict[str, Any]:
    """A random fp16 Qwen2 model at `shape`, saved with the real tokenizer; -> its weight bytes read per step."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    s = SHAPES[shape]
    config = Qwen2Config(vocab_size=VOCAB, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                         eos_token_id=151645, bos_token_id=151643, **s)
    if not (out / "config.json").exists():
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
        model.generation_config.eos_token_id = [151645, 151643]
        model.save_pretrained(out)
        del model
        torch.cuda.empty_cache()
        for f in tokenizer.iterdir():
            shutil.copy(f, out / f.name)
    return {"weight_bytes_read_per_step": make_model_bytes(s)}


def export(draft: Path, target: Path, out: Path, graphs: str = "torch") -> float:
    """An fp16 static-cache GQA pack of the pair; `graphs` "builder": the model builder's graphs for CUDA."""
    if (out / "manifest.json").exists():
        return 0.0
    t0 = time.perf_counter()
    from specpack.export.config import ExportConfig
    from specpack.export.pipeline import export_pack

    builder = {"graphs": "builder", "execution_provider": "cuda"} if graphs == "builder" else {}
    export_pack(str(draft), str(target), out, ExportConfig(k=K_MAX, max_len=MAX_LEN, dtype="fp16", kv_cache="static",
                                                           attention="gqa", isolate=False, **builder))
    return time.perf_counter() - t0


def open_pack(path: Path, cuda_graphs: bool) -> Any:
    import specpack
    from specpack.runtime.backend import BackendOptions

    return specpack.load(path, device="cuda", options=BackendOptions(cuda_graphs=cuda_graphs))


def step_costs(pack_dir: Path, cuda_graphs: bool, reps: int) -> dict[str, Any]:
    from specpack.bench.timing import measure_step_costs

    pack = open_pack(pack_dir, cuda_graphs)
    filler = np.random.default_rng(0).integers(0, 150000, 512).tolist()
    measure_step_costs(pack, list(range(1, K_MAX + 1)), CONTEXT, filler, reps=3, warmup=2)  # capture, warm up
    costs = measure_step_costs(pack, list(range(1, K_MAX + 1)), CONTEXT, filler, reps=reps, warmup=3)
    out = costs.to_dict()
    out["capture"] = pack.backend.capture_report()
    pack.close()
    return out


def phase_shapes(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """--graphs torch: result["shapes"]; --graphs builder: result["shapes_builder"] (each random model's folder is
    removed once its pack is written, to keep the disk: the 7B is 15 GB per copy)."""
    import shutil

    work = Path(args.work)
    copy_bw = result.get("card", {}).get("copy_bandwidth_gb_s")
    suffix = "" if args.graphs == "torch" else f"-{args.graphs}"
    shapes = result.setdefault(f"shapes{suffix.replace('-', '_')}", {})
    for shape in args.targets:
        pack_dir = work / f"pack-0.5b-{shape}{suffix}"
        models = {}
        for role in ("0.5b", shape):
            t0 = time.perf_counter()
            models[role] = make_model(role, work / f"random-{role}", Path(args.tokenizer)) \
                if not (pack_dir / "manifest.json").exists() else {"weight_bytes_read_per_step": make_model_bytes(SHAPES[role])}
            log(f"model {role}: {time.perf_counter() - t0:.0f} s")
        entry: dict[str, Any] = shapes.setdefault(shape, {"target": models[shape], "draft": models["0.5b"]})
        entry["export_s"] = export(work / "random-0.5b", work / f"random-{shape}", pack_dir, args.graphs)
        log(f"pack 0.5b/{shape}{suffix} exported in {entry['export_s']:.0f} s")
        if args.graphs != "torch" and shape != "0.5b":
            shutil.rmtree(work / f"random-{shape}", ignore_errors=True)
        for graphs in (True, False):
            label = "cuda_graphs" if graphs else "no_cuda_graphs"
            try:
                costs = step_costs(pack_dir, graphs, args.reps)
            except Exception as err:
                entry[label] = {"error": repr(err), "traceback": traceback.format_exc()[-2000:]}
                log(f"{shape} {label}: {err!r}")
                continue
            if copy_bw:
                step_s = costs["target_step_ms"] / 1e3
                costs["bandwidth_fraction"] = models[shape]["weight_bytes_read_per_step"] / step_s / (copy_bw * 1e9)
                costs["draft_bandwidth_fraction"] = (models["0.5b"]["weight_bytes_read_per_step"]
                                                     / (costs["draft_step_ms"] / 1e3) / (copy_bw * 1e9))
            entry[label] = costs
            log(f"{shape} {label}: target {costs['target_step_ms']:.3f} ms, draft {costs['draft_step_ms']:.3f} ms, "
                f"c {costs['c']:.3f}, v {json.dumps({k: round(x, 3) for k, x in costs['v'].items()})}")
            write(args, result)


def time_bare(model: Path | bytes, folder: Path, layers: int, kv_heads: int, head_dim: int, seq: int, k: int | None,
              capture: bool, reps: int) -> float:
    """Median ms of one bare run_with_iobinding of a static-cache graph over `seq` tokens after CONTEXT, every
    buffer on the device and bound once (a captured CUDA graph replayed when `capture`). k None: a plain graph
    (logits out); k: our verify graph (greedy form), k drafts."""
    import onnxruntime as ort

    from specpack import names
    from specpack.runtime.device_buffers import DeviceArray, DeviceStaticKVCache, bind
    from specpack.runtime.ort_session import EXTERNAL_DATA_FOLDER

    opts = ort.SessionOptions()
    opts.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(folder))
    opts.log_severity_level = 3
    provider = ("CUDAExecutionProvider", {"enable_cuda_graph": "1" if capture else "0"})
    session = ort.InferenceSession(str(model) if isinstance(model, Path) else model, opts, providers=[provider])
    wanted = {i.name for i in session.get_inputs()}
    cache = DeviceStaticKVCache(layers, kv_heads, head_dim, MAX_LEN, np.float16, "cuda")
    cache.length = CONTEXT
    rng = np.random.default_rng(0)
    ids = DeviceArray((1, seq), np.int64, "cuda")
    ids.write(rng.integers(0, 150000, (1, seq)))
    positions = DeviceArray((1, seq), np.int64, "cuda")
    positions.write(np.arange(CONTEXT, CONTEXT + seq, dtype=np.int64)[None])
    inputs = {names.INPUT_IDS: ids.view(), names.POSITION_IDS: positions.view(), **cache.bind_inputs(seq)}
    keep: list[DeviceArray] = []
    if k is None:
        out = DeviceArray((1, seq, VOCAB), np.float16, "cuda")
        outputs = {names.LOGITS: out.view()}
        keep.append(out)
    else:
        extra = {names.DRAFT_PROBS: DeviceArray((1, k, VOCAB), np.float32, "cuda"),
                 names.UNIFORMS: DeviceArray((1, k + 1), np.float32, "cuda"),
                 names.TEMPERATURE: DeviceArray((1,), np.float32, "cuda"),
                 names.TOP_K: DeviceArray((1,), np.int64, "cuda"), names.TOP_P: DeviceArray((1,), np.float32, "cuda")}
        extra[names.TOP_P].write(np.ones(1, np.float32))
        res = {names.N_ACCEPTED: DeviceArray((1,), np.int64, "cuda"), names.NEXT_TOKEN: DeviceArray((1,), np.int64, "cuda")}
        inputs.update({n: a.view() for n, a in extra.items()})
        outputs = {n: a.view() for n, a in res.items()}
        keep += [*extra.values(), *res.values()]
    binding = session.io_binding()
    bind(binding, "cuda", {n: v for n, v in inputs.items() if n in wanted}, {**cache.bind_outputs(seq), **outputs})
    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", "1" if capture else "-1")
    times = []
    for i in range(reps + 5):
        t0 = time.perf_counter()
        session.run_with_iobinding(binding, options)
        if i >= 5:
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def phase_builder(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """onnxruntime-genai's model builder graph (fp16, cuda: GroupQueryAttention with its rotary, fused layer norms)
    against our torch export of the same real 1.5B target (phase genai builds it), bare step times with every
    buffer on the device, CUDA graphs on and off. Ours is the verify graph (greedy form: + the head)."""
    from specpack.graphs.greedy_form import greedy_form

    work = Path(args.work)
    s = SHAPES["1.5b"]
    geometry = (s["num_hidden_layers"], s["num_key_value_heads"], s["hidden_size"] // s["num_attention_heads"])
    genai, pack = work / "genai-real-target", work / "pack-real"
    ours = greedy_form(pack / "verify.onnx")
    entry = result.setdefault("builder", {})
    for capture in (True, False):
        label = "cuda_graphs" if capture else "no_cuda_graphs"
        times: dict[str, float] = {}
        for seq in (1, 5):
            times[f"genai_S{seq}_ms"] = time_bare(genai / "model.onnx", genai, *geometry, seq, None, capture, args.reps)
            times[f"ours_S{seq}_ms"] = time_bare(ours, pack, *geometry, seq, seq - 1, capture, args.reps)
        entry[label] = times
        log(f"builder 1.5b {label}: {times}")
        write(args, result)


def real_prompts(args: argparse.Namespace) -> list[Any]:
    """4 HumanEval (plain completion) + 4 MT-bench (first turn, chat template, the first 4 categories)."""
    from specpack.prompts import read_prompts

    humaneval = [p for p in args.prompts if "HumanEval" in p]
    mtbench = [p for p in args.prompts if "mt_bench" in p]
    return read_prompts(humaneval, 4)[:4] + read_prompts(mtbench, 1)[:4]


def phase_real(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Our pack on the real pair: autoregressive (k = 0) and speculative (k = args.k) per prompt, energy each."""
    pack_dir = pack_dir_of(args, "real")
    real = result.setdefault("real", {})
    real["export_s"] = export(Path(args.draft_gguf), Path(args.target_gguf), pack_dir)
    log(f"real pack exported in {real['export_s']:.0f} s")
    decode_real(open_pack(pack_dir, True), args, real)
    real["source_dirs"] = source_dirs(pack_dir)


def source_dirs(pack_dir: Path) -> dict[str, str]:
    """role -> the Hugging Face directory the pack was exported from (the GGUF's conversion)."""
    from specpack.contract.manifest import Manifest

    manifest = Manifest.read(pack_dir)
    return {role: getattr(manifest, role).source.resolved for role in ("draft", "target")}


def our_run(result: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The pack whose figures the summary reports and the peers sit beside: the builder's graphs (genai_pack,
    the GPU export) where that phase ran, else our torch export (real)."""
    name = "genai_pack" if "source_dirs" in result.get("genai_pack", {}) else "real"
    return name, result.get(name, {})


def configs(args: argparse.Namespace) -> list[tuple[str, str, int | None]]:
    """(label, drafter, k) of each speculative run beside autoregressive: "spec" is the model drafter at k = args.k;
    --configs adds e.g. model:auto,ngram:4,ngram:auto (labels "model-auto", "ngram-4", "ngram-auto")."""
    runs: list[tuple[str, str, int | None]] = [("spec", "model", int(args.k))]
    for item in filter(None, args.configs.split(",")):
        drafter, k = item.split(":")
        runs.append((f"{drafter}-{k}", drafter, None if k == "auto" else int(k)))
    return runs


def decode_real(pack: Any, args: argparse.Namespace, into: dict[str, Any]) -> None:
    """c, v(k) at 256 tokens of context, then each prompt autoregressive (k = 0) and in every speculative
    configuration (configs()), energy each; the runs of one prompt are back to back (same machine state)."""
    import gc

    from specpack.bench.timing import measure_step_costs

    k = int(args.k)
    runs = configs(args)
    prompts = real_prompts(args)
    encoded = [(p, pack.encode(p.text, chat=p.chat)) for p in prompts]
    for _, drafter, kk in runs:  # warm up: capture the graphs of every run shape
        pack.generate(encoded[0][1], 16, k=kk, drafter=drafter)
    pack.generate(encoded[0][1], 16, k=0)
    costs = measure_step_costs(pack, list(range(1, K_MAX + 1)), 256, encoded[0][1], reps=30).to_dict()
    into["costs"] = costs
    rows = []
    for prompt, ids in encoded:
        row: dict[str, Any] = {"id": prompt.id, "prompt_tokens": len(ids)}
        for label, drafter, kk in [("ar", "model", 0), *runs]:
            with Energy() as energy:
                out = pack.generate(ids, 128, k=kk, drafter=drafter)
            row[label] = {"tokens": out.tokens, "stats": out.stats, "joules": energy.joules}
        row["identical"] = all(row[label]["tokens"] == row["ar"]["tokens"] for label, _, _ in runs)
        rows.append(row)
        log(f"{prompt.id}: ar {row['ar']['stats']['new_tokens']} tok, "
            + ", ".join(f"{label} alpha {row[label]['stats'].get('alpha'):.2f}" for label, _, _ in runs)
            + f", identical {row['identical']}")
    into["prompts"] = rows
    into["summary"] = summarize(rows, costs, k, [label for label, _, _ in runs])
    into["capture"] = pack.backend.capture_report()
    log(json.dumps(into["summary"]))
    pack.close()
    del pack
    gc.collect()


def phase_genai_pack(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Our heads on onnxruntime-genai's model builder graphs, through the cuda backend: the pack is exported by
    `spec-export --graphs builder --dtype fp16 --ep cuda` (export/builder_export.py) and opened by specpack.load."""
    import specpack

    entry = result.setdefault("genai_pack", {})
    pack_dir = pack_dir_of(args, "genai_pack")
    weights = (["--dequantize"] if args.quantize == "none"  # GGUF -> fp16, or GGUF -> dequantized -> the builder's int4
               else ["--quantize-draft", args.quantize, "--quantize-target", args.quantize])
    if not (pack_dir / "manifest.json").exists():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "specpack", "export", "--draft", args.draft_gguf, "--target",
                        args.target_gguf, "-o", str(pack_dir), "--graphs", "builder", "--dtype", "fp16", "--ep", "cuda",
                        *weights, "--k", str(K_MAX), "--max-len", str(args.max_len), "--overwrite"],
                       check=True, stdout=subprocess.DEVNULL)
        entry["export_s"] = time.perf_counter() - t0
    log("genai pack written")
    decode_real(specpack.load(pack_dir, device="cuda"), args, entry)
    entry["source_dirs"] = source_dirs(pack_dir)


def summarize(rows: list[dict[str, Any]], costs: dict[str, Any], k: int, labels: list[str]) -> dict[str, Any]:
    """Per subset (all, humaneval, mtbench): the model drafter at k ("spec") at the top level, as before, and
    every configuration under "configs": tokens/s, speedup over ar, alpha, tau, k histogram, identical."""
    def rate(label: str, subset: list[dict[str, Any]]) -> float:
        tokens = sum(r[label]["stats"]["new_tokens"] - 1 for r in subset)
        return tokens / sum(r[label]["stats"]["decode_s"] for r in subset)

    def joules(label: str, subset: list[dict[str, Any]]) -> float:
        return sum(r[label]["joules"] for r in subset) / sum(r[label]["stats"]["new_tokens"] for r in subset)

    out: dict[str, Any] = {}
    for name, subset in (("all", rows), ("humaneval", [r for r in rows if r["id"].startswith("HumanEval")]),
                         ("mtbench", [r for r in rows if not r["id"].startswith("HumanEval")])):
        ar = rate("ar", subset)
        parts: dict[str, Any] = {}
        for label in labels:
            proposed = sum(r[label]["stats"]["proposed"] for r in subset)
            accepted = sum(r[label]["stats"]["accepted"] for r in subset)
            steps = sum(r[label]["stats"]["steps"] for r in subset)
            hist = [sum(col) for col in zip(*(r[label]["stats"]["k_histogram"] for r in subset), strict=True)]
            spec = rate(label, subset)
            parts[label] = {"tokens_per_s": spec, "speedup": spec / ar, "alpha": accepted / proposed if proposed else 0.0,
                            "tau": (accepted + steps) / steps if steps else 0.0,  # stats.py: tokens per verify step
                            "k_histogram": hist, "joules_per_token": joules(label, subset),
                            "identical": f"{sum(r[label]['tokens'] == r['ar']['tokens'] for r in subset)}/{len(subset)}"}
        model = parts["spec"]
        out[name] = {"ar_tokens_per_s": ar, "spec_tokens_per_s": model["tokens_per_s"], "speedup": model["speedup"],
                     "alpha": model["alpha"], "tau": model["tau"],
                     "predicted_speedup": model["tau"] / (k * costs["c"] + costs["v"][str(k)]),
                     "identical": model["identical"], "ar_joules_per_token": joules("ar", subset),
                     "spec_joules_per_token": model["joules_per_token"], "configs": parts}
    return out


def phase_divergences(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Where a speculative configuration's greedy tokens leave autoregressive decoding's (fp16): the first
    differing position, the two tokens, and the target's top-2 logit gap there (transformers, fp32 on the GPU,
    over the prompt and the tokens both emitted): a gap near 0 is an fp16 rounding tie, not an error."""
    import torch
    from transformers import AutoModelForCausalLM

    from specpack.runtime.tokenizer import PackTokenizer

    name, ours = our_run(result)
    tokenizer = PackTokenizer.load(pack_dir_of(args, name) / "tokenizer")
    prompts = {p.id: tokenizer.encode_chat(p.text) if p.chat else tokenizer.encode(p.text) for p in real_prompts(args)}
    model = AutoModelForCausalLM.from_pretrained(ours["source_dirs"]["target"], dtype=torch.float32).to("cuda").eval()
    found = []
    for row in ours["prompts"]:
        ar = row["ar"]["tokens"]
        for label, run in row.items():
            if not isinstance(run, dict) or "tokens" not in run or label == "ar" or run["tokens"] == ar:
                continue
            i = next((j for j, (a, b) in enumerate(zip(ar, run["tokens"], strict=False)) if a != b),
                     min(len(ar), len(run["tokens"])))
            if i >= min(len(ar), len(run["tokens"])):
                found.append({"id": row["id"], "config": label, "position": i, "note": "one output is a prefix"})
                continue
            with torch.no_grad():
                x = torch.tensor([prompts[row["id"]] + ar[:i]], device="cuda")
                logits = model(x).logits[0, -1].float()
            top = torch.topk(logits, 2)
            found.append({"id": row["id"], "config": label, "position": i, "ar_token": ar[i],
                          "spec_token": run["tokens"][i], "top2_gap": float(top.values[0] - top.values[1]),
                          "gap_between_the_two": float(logits[ar[i]] - logits[run["tokens"][i]])})
            log(f"divergence: {found[-1]}")
    ours["divergences"] = found


def phase_hf(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """transformers bf16 on the GPU: generate (hf-ar) and assisted generation with the draft (hf-assisted)."""
    import torch
    from transformers import AutoModelForCausalLM

    from specpack.runtime.tokenizer import PackTokenizer

    name, real = our_run(result)
    dirs = real["source_dirs"]
    tokenizer = PackTokenizer.load(pack_dir_of(args, name) / "tokenizer")
    prompts = [(p, tokenizer.encode_chat(p.text) if p.chat else tokenizer.encode(p.text)) for p in real_prompts(args)]
    target = AutoModelForCausalLM.from_pretrained(dirs["target"], dtype=torch.bfloat16).to("cuda").eval()
    draft = AutoModelForCausalLM.from_pretrained(dirs["draft"], dtype=torch.bfloat16).to("cuda").eval()
    eos = [151645, 151643]
    peers: dict[str, Any] = {}
    for name, extra in (("hf-ar", {}), ("hf-assisted", {"assistant_model": draft})):
        rows = []
        for prompt, ids in prompts:
            x = torch.tensor([ids], device="cuda")
            kwargs = {"attention_mask": torch.ones_like(x), "do_sample": False, "eos_token_id": eos,
                      "pad_token_id": eos[0], **extra}
            target.generate(x, max_new_tokens=4, **kwargs)  # warm up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            target.generate(x, max_new_tokens=1, **kwargs)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            with Energy() as energy:
                t0 = time.perf_counter()
                out = target.generate(x, max_new_tokens=128, **kwargs)
                torch.cuda.synchronize()
                total = time.perf_counter() - t0
            tokens = out[0, len(ids) :].tolist()
            rows.append({"id": prompt.id, "tokens": tokens, "decode_s": max(total - first, 1e-9), "joules": energy.joules})
        decoded = sum(len(r["tokens"]) - 1 for r in rows)
        peers[name] = {"tokens_per_s": decoded / sum(r["decode_s"] for r in rows),
                       "joules_per_token": sum(r["joules"] for r in rows) / sum(len(r["tokens"]) for r in rows),
                       "prompts": rows}
        log(f"{name}: {peers[name]['tokens_per_s']:.1f} tok/s")
    real.setdefault("peers", {}).update(peers)


def with_graphs(path: Path, graphs: bool) -> Any:
    """onnxruntime-genai's model in `path` on its CUDA provider, with or without CUDA graphs."""
    import onnxruntime_genai as og

    config = og.Config(str(path))
    config.clear_providers()
    config.append_provider("cuda")
    config.set_provider_option("cuda", "enable_cuda_graph", "1" if graphs else "0")
    return og.Model(config)


def phase_genai(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """onnxruntime-genai 0.18 (model builder fp16 cuda graphs) on the same prompts: autoregressive with and without
    CUDA graphs (onnxruntime-genai-ar), and its speculative mode with the draft (onnxruntime-genai-spec)."""
    import onnxruntime_genai as og

    from specpack.runtime.tokenizer import PackTokenizer

    name, real = our_run(result)
    work = Path(args.work)
    built = {}
    precision, suffix = ("fp16", "") if args.quantize == "none" else (args.quantize, f"-{args.quantize}")
    for role, src in real["source_dirs"].items():
        out = work / f"genai-real-{role}{suffix}"  # the builder's defaults for int4 (its own model, as a user runs it)
        if not (out / "genai_config.json").exists():
            subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", src, "-o", str(out),
                            "-p", precision, "-e", "cuda", "-c", str(work / "genai-cache")], check=True,
                           stdout=subprocess.DEVNULL)
        built[role] = out
    tokenizer = PackTokenizer.load(pack_dir_of(args, name) / "tokenizer")
    prompts = [(p, tokenizer.encode_chat(p.text) if p.chat else tokenizer.encode(p.text)) for p in real_prompts(args)]
    peers = real.setdefault("peers", {})

    def run(name: str, make_model: Any, search: dict[str, Any]) -> None:
        try:
            model = make_model()
            rows = []
            for prompt, ids in [prompts[0], *prompts]:  # the first one twice: warm-up (graph capture)
                params = og.GeneratorParams(model)
                params.set_search_options(max_length=MAX_LEN, do_sample=False, **search)
                with Energy() as energy:
                    gen = og.Generator(model, params)
                    gen.append_tokens(ids)
                    gen.generate_next_token()
                    t_first = time.perf_counter()
                    n = 1
                    while not gen.is_done() and n < 128:
                        gen.generate_next_token()
                        n += 1
                    decode_s = time.perf_counter() - t_first
                tokens = [int(t) for t in gen.get_sequence(0)][len(ids) :]
                rows.append({"id": prompt.id, "tokens": tokens, "decode_s": decode_s, "joules": energy.joules})
                del gen
            rows = rows[1:]
            decoded = sum(len(r["tokens"]) - 1 for r in rows)
            peers[name] = {"tokens_per_s": decoded / sum(r["decode_s"] for r in rows),
                           "joules_per_token": sum(r["joules"] for r in rows) / sum(len(r["tokens"]) for r in rows),
                           "prompts": rows}
            log(f"{name}: {peers[name]['tokens_per_s']:.1f} tok/s")
        except Exception as err:
            peers[name] = {"error": repr(err)}
            log(f"{name}: {err!r}")

    if not args.spec_only:
        run("onnxruntime-genai-ar-no-graphs", lambda: with_graphs(built["target"], False), {})
        run("onnxruntime-genai-ar", lambda: with_graphs(built["target"], True), {})
    spec = work / f"genai-real-spec{suffix}"  # the target's folder with the draft beside it (model.draft in genai_config)
    if not (spec / "draft.onnx").exists() or args.rebuild_spec:
        import shutil

        shutil.rmtree(spec, ignore_errors=True)
        shutil.copytree(built["target"], spec)
        for f in built["draft"].iterdir():
            if f.name.startswith("model.onnx"):
                shutil.copy(f, spec / f.name.replace("model", "draft"))
        config = json.loads((spec / "genai_config.json").read_text())
        draft_config = json.loads((built["draft"] / "genai_config.json").read_text())
        draft = dict(draft_config["model"]["decoder"], filename="draft.onnx")
        draft["session_options"] = config["model"]["decoder"]["session_options"]  # the same EP as the target
        config["model"]["draft"] = draft
        (spec / "genai_config.json").write_text(json.dumps(config, indent=2))
    run("onnxruntime-genai-spec", lambda: with_graphs(spec, True), {"speculative.max_draft_tokens": int(args.k)})


def phase_summary(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The issue's top-level fields from the phases' results (real pair: all 8 prompts, k = args.k)."""
    name, real = our_run(result)
    card_info = result.get("card", {})
    summary = real.get("summary", {}).get("all", {})
    costs = real.get("costs", {})
    peers = real.get("peers", {})
    step_s = costs.get("target_step_ms", 0.0) / 1e3
    read = SHAPES["1.5b"]
    bytes_read = make_model_bytes(read)
    bandwidth = card_info.get("copy_bandwidth_gb_s", 0.0) * 1e9
    result.update({
        "summary_of": name,
        "device": card_info.get("device"),
        "speedup": summary.get("speedup"),
        "predicted_speedup": summary.get("predicted_speedup"),
        "spec_tokens_per_s": summary.get("spec_tokens_per_s"),
        "ar_tokens_per_s": summary.get("ar_tokens_per_s"),
        "bandwidth_fraction": bytes_read / step_s / bandwidth if step_s and bandwidth else None,
        "joules_per_token": {"spec": summary.get("spec_joules_per_token"), "ar": summary.get("ar_joules_per_token"),
                             **{name: peer.get("joules_per_token") for name, peer in peers.items()}},
        "peers": {name: peer.get("tokens_per_s") for name, peer in peers.items()},
    })
    seven = result.get("shapes", {}).get("7b", {}).get("cuda_graphs")
    if seven and summary:
        k = int(args.k)
        result["predicted_speedup_0.5b_draft_7b_target"] = {
            name: part["tau"] / (k * seven["c"] + seven["v"][str(k)])
            for name, part in real["summary"].items()}


def make_model_bytes(shape: dict[str, Any]) -> int:
    """Weight bytes (fp16) a step reads: every weight, the embedding table only when it is tied to the lm_head."""
    h, v = shape["hidden_size"], VOCAB
    kv = shape["num_key_value_heads"] * (h // shape["num_attention_heads"])
    per_layer = h * (h + 2 * kv) + (h + 2 * kv) + h * h + 3 * h * shape["intermediate_size"] + 2 * h
    params = shape["num_hidden_layers"] * per_layer + h + v * h * (1 if shape["tie_word_embeddings"] else 2)
    return 2 * (params - (0 if shape["tie_word_embeddings"] else v * h))


class Energy:
    """The GPU's energy counter (NVML, millijoules) over a block."""

    def __enter__(self) -> Energy:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self._start = pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        self.joules = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.joules = (self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) - self._start) / 1e3


def write(args: argparse.Namespace, result: dict[str, Any]) -> None:
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--tokenizer", help="a Qwen2.5 tokenizer directory (tokenizer.json, tokenizer_config.json)")
    parser.add_argument("--phases", default="card,shapes,real,hf,genai,builder,summary")
    parser.add_argument("--targets", nargs="+", default=["1.5b", "7b"])
    parser.add_argument("--graphs", choices=("torch", "builder"), default="torch",
                        help="shapes phase: who writes the plain graphs (spec-export --graphs)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--draft-gguf")
    parser.add_argument("--target-gguf")
    parser.add_argument("--prompts", nargs="*", default=[])
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--k", default="4")
    parser.add_argument("--configs", default="model:auto,ngram:4,ngram:auto",
                        help="real / genai_pack phases: speculative runs beside ar and the model drafter at --k")
    parser.add_argument("--max-len", type=int, default=1024, help="genai_pack phase: the exported pack's max_len")
    parser.add_argument("--quantize", choices=("none", "int4"), default="none",
                        help="genai_pack / genai phases: weights of our pack (spec-export --quantize-draft/--quantize-target"
                             " int4 through the builder) and of onnxruntime-genai's models (builder -p int4)")
    parser.add_argument("--spec-only", action="store_true", help="genai phase: its speculative mode alone")
    parser.add_argument("--rebuild-spec", action="store_true", help="rewrite the genai speculative folder's config")
    args = parser.parse_args()
    result: dict[str, Any] = json.loads(Path(args.json).read_text()) if Path(args.json).exists() else {}
    phases = {"card": lambda: result.__setitem__("card", card()), "shapes": lambda: phase_shapes(args, result),
              "real": lambda: phase_real(args, result), "builder": lambda: phase_builder(args, result),
              "hf": lambda: phase_hf(args, result), "genai": lambda: phase_genai(args, result),
              "summary": lambda: phase_summary(args, result),
              "genai_pack": lambda: phase_genai_pack(args, result),
              "divergences": lambda: phase_divergences(args, result)}
    for name in args.phases.split(","):
        t0 = time.perf_counter()
        try:
            phases[name]()
        except Exception as err:
            result.setdefault("errors", {})[name] = traceback.format_exc()[-3000:]
            log(f"phase {name} failed: {err!r}")
        result.setdefault("phase_s", {})[name] = time.perf_counter() - t0
        write(args, result)
        log(f"phase {name}: {time.perf_counter() - t0:.0f} s")
    os.sync()


if __name__ == "__main__":
    main()
