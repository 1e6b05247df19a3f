"""The draft head on the GPU in one device call after staging (bench/README.md, "The draft head on the GPU"):

    python bench/gpu_head.py --work /tmp/gw --target-gguf T.gguf --prompts HumanEval.jsonl.gz mt_bench_question.jsonl \\
        [spec_bench_question.jsonl] --json OUT.json [--train-minutes 6 | --train-steps N] [--graphs torch|builder]
        [--phases card,train,export,decode,specbench,genai,trees]

train   `specpack distill --device cuda` on the target (default recipe: Python's standard library + the target's own
        answers to prompts it was given from seed_prompts.py): a probe of PROBE_STEPS steps builds the data and times a
        step, then a fresh run whose step count fits --train-minutes reads the probe's data (its corpus key matches)
        (with `trees` among the phases, the tree pack's export starts in the background when training starts)
export  `spec-export --draft-head` in the cuda backend's form (static cache, GQA, fp16, k 8, max_len 2560);
        --graphs builder: the target is onnxruntime-genai's model builder graph with the features cache added
decode  4 HumanEval + 4 MT-bench prompts, 128 new tokens, greedy: autoregressive, the head at k 1..6 and adaptive,
        prompt lookup at k 4, each prompt's runs back to back; step costs at 256 tokens (c, v(k)); predicted speedups;
        every run's steps ([k, accepted, step ms, draft ms, warm-up runs so far]; so does specbench)
specbench  the Spec-Bench file's first SPEC_BENCH_PER_CATEGORY prompts of each category (prompts over
        SPEC_BENCH_MAX_PROMPT tokens left out, counted): autoregressive, the head at k 2 and adaptive, prompt lookup k 4,
        on a pack that captured every chain shape at load, after a warm-up on the first decode prompt
specbench-trees  the same on the head's tree pack (exported unless `headtrees` ran): chains against trees per
        category, the head's (k 2, adaptive, tree auto, 8 nodes) and prompt lookup's (k 4, tree auto)
specbench-lazy  the same with shapes captured on first use (Run G's way), into "specbench_lazy": an A/B of
        pre-capture, same session
headcost  bench/head_step_cost.py: the trained head's step graph in the standard and the gqa form (the pack's since
        the gqa head form), each alone on the card, CUDA graphs, median ms per run (docs/heads.md)
genai   onnxruntime-genai autoregressive with and without CUDA graphs on the same target (bench/gpu.py's phase_genai)
arprofile  our k 0 step and onnxruntime-genai's (after `genai`) under PyTorch's profiler: kernels per token, the largest
scatter-ab  our AR and the head at k 3 with the cache writes widened (graphs/element_scatter.py) and as exported
treecost  bench/tree_head_costs.py --graphs builder --profile at the 1.5B shape: where the builder's tree verify grows
keep    the trained head's files and its training corpus (HEAD/ckpt/corpus.*) split into KEEP_CHUNK pieces under
        WORK/keep (with their sha256 in keep.json), for `run` calls to bring back 4 at a time (files back: 8 of 16 MiB,
        64 MiB a call); join them here with `cat head.safetensors.* > head.safetensors` and check the sha256 in
        keep.json. `--corpus DIR` (a folder of the joined corpus.npz, corpus.json, corpus.key.json) lets a later
        session train on that corpus without building it again (8 minutes on an H200 for run E's): its key (recipe,
        data options, seed, target hash) must match, so pass the same --data
trees   a prompt-lookup tree pack (--drafter ngram --max-tree-nodes TREE_NODES, --tree-graphs, static, fp16): prompt
        lookup as chains (k 4, adaptive) and as trees (auto, fixed sizes) on the 8 prompts, with its own AR; after
        `headtrees` (and no training), on the head's tree pack instead
model   the 0.5B draft model beside the head, same run (the issue's must-show): a model-drafter pack of --draft-gguf
        and the target on the head pack's graphs (builder or torch, fp16, static), step costs (its c), then per prompt
        of the 8, back to back: the head pack's AR and head k 3 / adaptive, the model pack's AR and the model drafter at
        k 2 / 3 / 4 / adaptive; speedups over the head pack's AR (our AR everywhere else) and over its own pack's
headtrees  a tree pack of the trained head (--draft-head, on --tree-graphs): the head's chains (k 2, adaptive) and
        EAGLE-2 trees (auto, 4, 8, 16 nodes) on the 8 prompts, with the tree pack's own AR
Each phase writes the JSON as it ends; a failing phase records its error and the next runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu

PROBE_STEPS = 20
K_SWEEP = (1, 2, 3, 4, 6)
MAX_LEN = 2560
SPEC_BENCH_PER_CATEGORY = 4
SPEC_BENCH_MAX_PROMPT = 2048
TREE_NODES = 16
AR_PROFILE_TOKENS = 128
TREE_RUNS: list[tuple[str, int | None, int | str]] = [("ar", 0, "off"), ("chain-4", 4, "off"), ("chain-auto", None, "off"),
                                                      ("tree-auto", None, "auto"), ("tree-8", None, 8),
                                                      ("tree-16", None, 16)]
HEAD_TREE_RUNS: list[tuple[str, int | None, int | str]] = [("ar", 0, "off"), ("chain-2", 2, "off"),
                                                           ("chain-auto", None, "off"), ("tree-auto", None, "auto"),
                                                           ("tree-4", None, 4), ("tree-8", None, 8),
                                                           ("tree-16", None, 16)]
KEEP_CHUNK = 15 << 20
CORPUS_FILES = ("corpus.npz", "corpus.json", "corpus.key.json")  # distill's saved corpus (specpack/distill/data.py)
DISTILL = ["--device", "cuda", "--seq-len", "512", "--no-progress", "--checkpoint-every", "100000"]


class TracedPolicy:
    """A request's k policy, every step recorded: [k, accepted, step ms, draft ms, warm-up runs so far] (Run F could
    not tell why adaptive k locked at k = 0: its results held totals only)."""

    def __init__(self, policy: Any, steps: list[list[float]], warmups: Any) -> None:
        self.policy, self.steps, self.warmups = policy, steps, warmups

    @property
    def k_max(self) -> int:
        return int(self.policy.k_max)

    def next_k(self, state: Any) -> int:
        return int(self.policy.next_k(state))

    def observe(self, k: int, n_accepted: int, elapsed_s: float, draft_s: float, *, tree: Any = None) -> None:
        self.steps.append([k, n_accepted, round(elapsed_s * 1e3, 4), round(draft_s * 1e3, 4), self.warmups()])
        self.policy.observe(k, n_accepted, elapsed_s, draft_s, tree=tree)


def trace_steps(pack: Any) -> list[list[float]]:
    """Wrap the pack's policies (bench only): the returned list holds the steps of the requests that follow; clear
    it between requests."""
    steps: list[list[float]] = []
    make = pack.policy
    pack.policy = lambda *args, **kwargs: TracedPolicy(make(*args, **kwargs), steps, pack.backend.warmup_runs)
    return steps


def log(line: str) -> None:
    print(f"[gpu_head] {line}", file=sys.stderr, flush=True)


def specpack(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "specpack", *args], check=True)


def phase_train(args: argparse.Namespace, result: dict[str, Any]) -> None:
    import torch

    work = Path(args.work)
    probe, head = work / "head-probe", work / "head"
    if head.exists():  # the staged head (phases before `train` ran on it): kept beside, the new one takes its place
        shutil.rmtree(work / "head-staged", ignore_errors=True)
        head.rename(work / "head-staged")
    if args.corpus:  # a corpus built by an earlier session: distill reads it when its key matches this run's
        (probe / "ckpt").mkdir(parents=True, exist_ok=True)
        for name in CORPUS_FILES:
            shutil.copy(Path(args.corpus) / name, probe / "ckpt" / name)
    t0 = time.perf_counter()
    data = [*args.data.split(), "--batch", str(args.train_batch)]
    specpack("distill", "--target", args.target_gguf, "-o", str(probe), "--steps", "100000", "--stop-at",
             str(PROBE_STEPS), *DISTILL, *data)
    state = torch.load(probe / "ckpt" / "latest.pt", map_location="cpu", weights_only=False)
    per_step = float(state["wall_s"]) / PROBE_STEPS
    if "trees" in args.phases.split(","):  # CPU-bound export beside the training (its own log), after the probe
        args.tree_export = start_tree_export(args)  # converted the GGUF: the two never convert it at once
    # the probe's steps include the first steps' warm-up: 199 / 229 ms a step against 132 / 137 ms in the training
    # that followed (Runs I and J, H100), so --train-minutes gets about 0.6 of its minutes; --train-steps sets them
    steps = args.train_steps or max(50, int(60 * args.train_minutes / per_step))
    log(f"probe: {time.perf_counter() - t0:.0f} s in all, {per_step * 1e3:.0f} ms a step -> {steps} steps")
    (head / "ckpt").mkdir(parents=True, exist_ok=True)
    for name in CORPUS_FILES:
        shutil.copy(probe / "ckpt" / name, head / "ckpt" / name)
    t1 = time.perf_counter()
    specpack("distill", "--target", args.target_gguf, "-o", str(head), "--steps", str(steps), *DISTILL, *data)
    record = json.loads((head / "head.json").read_text())
    result["train"] = {"probe_step_ms": per_step * 1e3, "steps": steps, "train_call_s": time.perf_counter() - t1,
                       "data": record["data"], "recipe": record["recipe"], "training": record["training"],
                       "losses": record["losses"], "heldout": record.get("heldout"),
                       "weights_sha256": record["weights_sha256"]}


def phase_export(args: argparse.Namespace, result: dict[str, Any]) -> None:
    work = Path(args.work)
    t0 = time.perf_counter()
    graphs = ["--graphs", "builder", "--ep", "cuda"] if args.graphs == "builder" else ["--attention", "gqa"]
    specpack("export", "--target", args.target_gguf, "--draft-head", str(work / "head"),
             "-o", str(work / "pack-head"), "--kv-cache", "static", *graphs, "--dtype", "fp16", "--k", "8",
             "--max-len", str(MAX_LEN), "--dequantize", "--overwrite")
    result["export_s"] = time.perf_counter() - t0
    result["export_graphs"] = args.graphs


def phase_decode(args: argparse.Namespace, result: dict[str, Any]) -> None:
    import specpack as sp
    from specpack.bench.timing import measure_step_costs

    t0 = time.perf_counter()
    pack = sp.load(Path(args.work) / "pack-head", device=args.device)  # every chain shape captured at load
    result["decode_load_s"] = time.perf_counter() - t0
    runs: list[tuple[str, str, int | None]] = [("ar", "head", 0), *((f"head-{k}", "head", k) for k in K_SWEEP),
                                               ("head-auto", "head", None), ("ngram-4", "ngram", 4)]
    prompts = gpu.real_prompts(args)
    encoded = [(p, pack.encode(p.text, chat=p.chat)) for p in prompts]
    for _, drafter, k in runs:  # warm up: capture every run shape
        pack.generate(encoded[0][1], 32, k=k, drafter=drafter)
    costs = measure_step_costs(pack, list(range(1, 9)), 256, encoded[0][1], reps=30).to_dict()
    steps = trace_steps(pack)
    rows = []
    for prompt, ids in encoded:
        row: dict[str, Any] = {"id": prompt.id, "prompt_tokens": len(ids)}
        for label, drafter, k in runs:
            steps.clear()
            out = pack.generate(ids, 128, k=k, drafter=drafter)
            row[label] = {"tokens": out.tokens, "stats": dict(out.stats), "steps": list(steps)}
        row["identical"] = {label: row[label]["tokens"] == row["ar"]["tokens"] for label, _, _ in runs}
        rows.append(row)
        log(f"{prompt.id}: " + ", ".join(f"{label} {row[label]['stats'].get('tokens_per_s', 0):.0f}" for label, _, _ in runs))
    result["decode"] = {"costs": costs, "prompts": rows, "summary": summarize(rows, costs, runs),
                        "capture": getattr(pack.backend, "capture_report", dict)()}
    log(json.dumps(result["decode"]["summary"], indent=1))
    pack.close()


SPEC_BENCH_RUNS: list[tuple[str, str, int | None, int | str | None]] = [
    ("ar", "head", 0, None), ("head-2", "head", 2, None), ("head-auto", "head", None, None), ("ngram-4", "ngram", 4, None)]
SPEC_BENCH_TREE_RUNS: list[tuple[str, str, int | None, int | str | None]] = [
    ("ar", "head", 0, "off"), ("head-2", "head", 2, "off"), ("head-auto", "head", None, "off"),
    ("head-tree-auto", "head", None, "auto"), ("head-tree-8", "head", None, 8), ("ngram-4", "ngram", 4, "off"),
    ("ngram-tree-auto", "ngram", None, "auto")]


def phase_specbench(args: argparse.Namespace, result: dict[str, Any], lazy_capture: bool = False,
                    trees: bool = False) -> None:
    """Per Spec-Bench category: AR, the head at k 2 and adaptive, prompt lookup k 4 (greedy, 128 tokens), on a pack
    that captured every chain shape at load (backends/cuda_precapture.py), after one warm-up request per
    configuration. lazy_capture (`specbench-lazy`, into result["specbench_lazy"]): the same with shapes captured on
    first use (Run G's way), for an A/B in one session. trees (`specbench-trees`, into result["specbench_trees"]): on
    the head's tree pack (exported as `headtrees` does, unless it ran), chains against trees per category for both
    drafters (SPEC_BENCH_TREE_RUNS)."""
    import specpack as sp
    from specpack.prompts import read_prompts
    from specpack.runtime.backend import BackendOptions

    files = [p for p in args.prompts if "spec_bench" in p]
    work = Path(args.work)
    pack_dir = work / ("pack-head-tree" if trees else "pack-head")
    if trees and not (pack_dir / "manifest.json").is_file():
        subprocess.run(tree_export_command(args, ["--draft-head", str(work / "head")], pack_dir, args.tree_graphs),
                       check=True)
    t0 = time.perf_counter()
    pack = sp.load(pack_dir, device=args.device, options=BackendOptions(precapture=not lazy_capture))
    load_s = time.perf_counter() - t0
    runs = SPEC_BENCH_TREE_RUNS if trees else SPEC_BENCH_RUNS

    def generate(ids: list[int], n: int, drafter: str, k: int | None, tree: int | str | None) -> Any:
        return pack.generate(ids, n, k=k, drafter=drafter, **({} if tree is None else {"tree": tree}))

    rows, skipped = [], 0
    warm = gpu.real_prompts(args)[0]
    for _, drafter, k, tree in runs:  # Run G's warm-up, in both arms (the pack's pooled acceptance starts alike)
        generate(pack.encode(warm.text, chat=warm.chat), 32, drafter, k, tree)
    steps = trace_steps(pack)
    for prompt in read_prompts(files, SPEC_BENCH_PER_CATEGORY):
        ids = pack.encode(prompt.text, chat=prompt.chat)
        if len(ids) > SPEC_BENCH_MAX_PROMPT:
            skipped += 1
            continue
        row: dict[str, Any] = {"id": prompt.id, "category": prompt.category, "prompt_tokens": len(ids)}
        for label, drafter, k, tree in runs:
            steps.clear()
            out = generate(ids, 128, drafter, k, tree)
            row[label] = {"tokens": out.tokens, "stats": dict(out.stats), "steps": list(steps)}
        row["identical"] = {label: row[label]["tokens"] == row["ar"]["tokens"] for label, *_ in runs}
        rows.append(row)
        log(f"{prompt.id} ({prompt.category}): " + ", ".join(
            f"{label} {row[label]['stats'].get('tokens_per_s', 0):.0f}" for label, *_ in runs))
    categories: dict[str, Any] = {}
    for category in sorted({r["category"] for r in rows}):
        part = [r for r in rows if r["category"] == category]
        ar = _rate(part, "ar")
        categories[category] = {"prompts": len(part), "ar_tokens_per_s": ar, **{
            label: {"speedup": _rate(part, label) / ar, "identical": sum(r["identical"][label] for r in part),
                    "tau": sum(r[label]["stats"]["new_tokens"] for r in part)
                    / max(1, sum(r[label]["stats"]["steps"] for r in part))}
            for label, *_ in runs[1:]}}
    result["specbench_trees" if trees else "specbench_lazy" if lazy_capture else "specbench"] = {
        "rows": rows, "categories": categories, "skipped_long": skipped, "per_category": SPEC_BENCH_PER_CATEGORY,
        "max_prompt": SPEC_BENCH_MAX_PROMPT, "lazy_capture": lazy_capture, "load_s": load_s,
        "capture": getattr(pack.backend, "capture_report", dict)()}
    log(json.dumps(categories, indent=1))
    pack.close()


MODEL_RUNS: list[tuple[str, str, str, int | None]] = [("ar", "head", "head", 0), ("head-3", "head", "head", 3),
                                                      ("head-auto", "head", "head", None),
                                                      ("model-ar", "model", "model", 0),
                                                      *((f"model-{k}", "model", "model", k) for k in (2, 3, 4)),
                                                      ("model-auto", "model", "model", None)]


def phase_model(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The 0.5B draft model on the GPU beside the head, same run: its pack exported on the head pack's graphs, then
    MODEL_RUNS (label, pack, drafter, k) per prompt back to back, 128 tokens, greedy (module docstring, `model`)."""
    import specpack as sp
    from specpack.bench.timing import measure_step_costs

    if not args.draft_gguf:
        raise RuntimeError("the model phase needs --draft-gguf (stage it: STAGE_DRAFT=1 bash bench/device/stage_head_run.sh)")
    work = Path(args.work)
    t0 = time.perf_counter()
    graphs = ["--graphs", "builder", "--ep", "cuda"] if args.graphs == "builder" else ["--attention", "gqa"]
    if not (work / "pack-model" / "manifest.json").is_file():  # exported once a session
        specpack("export", "--draft", args.draft_gguf, "--target", args.target_gguf, "-o", str(work / "pack-model"),
                 "--kv-cache", "static", *graphs, "--dtype", "fp16", "--k", "8", "--max-len", str(MAX_LEN),
                 "--dequantize", "--overwrite")
    export_s = time.perf_counter() - t0
    packs = {"head": sp.load(work / "pack-head", device=args.device), "model": sp.load(work / "pack-model", device=args.device)}
    encoded = [(p, {name: pack.encode(p.text, chat=p.chat) for name, pack in packs.items()}) for p in gpu.real_prompts(args)]
    for _, pack_name, drafter, k in MODEL_RUNS:  # warm up
        packs[pack_name].generate(encoded[0][1][pack_name], 32, k=k, drafter=drafter)
    costs = {name: measure_step_costs(pack, list(range(1, 9)), 256, encoded[0][1][name], reps=30).to_dict()
             for name, pack in packs.items()}
    rows = []
    for prompt, ids in encoded:
        row: dict[str, Any] = {"id": prompt.id}
        for label, pack_name, drafter, k in MODEL_RUNS:
            out = packs[pack_name].generate(ids[pack_name], 128, k=k, drafter=drafter)
            row[label] = {"tokens": out.tokens, "stats": dict(out.stats)}
        row["identical"] = {label: row[label]["tokens"] == row["ar"]["tokens"] for label, *_ in MODEL_RUNS}
        rows.append(row)
        log(f"{prompt.id}: " + ", ".join(f"{label} {row[label]['stats'].get('tokens_per_s', 0):.0f}"
                                         for label, *_ in MODEL_RUNS))
    own_ar = {"head": "ar", "model": "model-ar"}
    summary = {label: {"tokens_per_s": _rate(rows, label), "vs_our_ar": _rate(rows, label) / _rate(rows, "ar"),
                       "vs_its_pack_ar": _rate(rows, label) / _rate(rows, own_ar[pack_name]),
                       "tau": sum(r[label]["stats"]["new_tokens"] for r in rows)
                       / max(1, sum(r[label]["stats"]["steps"] for r in rows)),
                       "identical": sum(r["identical"][label] for r in rows)}
               for label, pack_name, _, _ in MODEL_RUNS}
    result["model"] = {"export_s": export_s, "costs": costs, "rows": rows, "summary": summary,
                       "capture": {name: getattr(pack.backend, "capture_report", dict)() for name, pack in packs.items()}}
    log(json.dumps(summary, indent=1))
    for pack in packs.values():
        pack.close()


def phase_scatter_ab(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Our AR and the head at k 3 on the 8 prompts, with the cache writes widened to an element per index (the
    backend's way since Run H: graphs/element_scatter.py) and as exported (a row per ScatterND thread), and widened
    without the pad row (BackendOptions.pad_single_steps off: a k = 0 step over one row, as the peer runs it), the
    packs alternating per prompt: what the widening buys a step, and what the pad row costs. Whether every greedy
    output agrees is recorded (the pad row exists so that they do: docs/architecture.md)."""
    import specpack as sp
    import specpack.graphs.element_scatter as element_scatter
    from specpack.runtime.backend import BackendOptions

    widen = element_scatter.element_scatter_bytes
    packs = {}
    for label, rewrite, pad in (("widened", widen, True), ("as_exported", lambda model: model, True),
                                ("widened_one_row", widen, False)):
        element_scatter.element_scatter_bytes = rewrite  # bench only: what open_session applies (restored below)
        try:
            packs[label] = sp.load(Path(args.work) / "pack-head", device=args.device,
                                   options=BackendOptions(pad_single_steps=pad))
        finally:
            element_scatter.element_scatter_bytes = widen
    rows = []
    for prompt in gpu.real_prompts(args):
        row: dict[str, Any] = {"id": prompt.id}
        for label, pack in packs.items():
            ids = pack.encode(prompt.text, chat=prompt.chat)
            for name, k in (("ar", 0), ("head-3", 3)):
                out = pack.generate(ids, 128, k=k, drafter="head")
                row[f"{label}/{name}"] = {"tokens_per_s": out.stats["tokens_per_s"], "tokens": out.tokens}
        row["identical"] = len({tuple(v["tokens"]) for v in row.values() if isinstance(v, dict)}) == 1
        rows.append(row)
        log(f"{prompt.id}: " + ", ".join(f"{key} {value['tokens_per_s']:.0f}" for key, value in row.items()
                                         if isinstance(value, dict)))
    summary = {key: statistics.median(r[key]["tokens_per_s"] for r in rows) for key in rows[0]
               if isinstance(rows[0][key], dict)}
    result["scatter_ab"] = {"rows": rows, "median_tokens_per_s": summary,
                            "identical": sum(r["identical"] for r in rows)}
    log(json.dumps(summary))
    for pack in packs.values():
        pack.close()


def phase_headcost(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """bench/head_step_cost.py on the trained head: its step graph in the standard and gqa forms, alone on the card."""
    from specpack.contract.manifest import Manifest

    work = Path(args.work)
    target = Manifest.read(work / "pack-head").target.source.resolved
    out = work / "headcost.json"
    subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "head_step_cost.py"), "--head",
                    str(work / "head"), "--target", str(target), "--json", str(out), "--max-len", str(MAX_LEN),
                    "--device", args.device, *(["--profile"] if args.device == "cuda" else [])], check=True)
    result["headcost"] = json.loads(out.read_text())


def phase_treecost(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """bench/tree_head_costs.py on the model builder's graphs at the 1.5B shape (random weights) with --profile: v(T)
    and the kernels of the chain verify of one draft and of trees of 1 and 16 nodes (the builder's tree verify grew
    with its nodes in run E: v(16) 1.54)."""
    work = Path(args.work)
    out = work / "treecost.json"
    subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "tree_head_costs.py"), "--work",
                    str(work / "treecost"), "--json", str(out), "--graphs", "builder", "--profile",
                    "--device", args.device, *([] if args.device == "cuda" else ["--shape", "tiny"])], check=True)
    result["treecost"] = json.loads(out.read_text())


def phase_keep(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The head's files and its corpus in KEEP_CHUNK pieces (a device call brings back at most 64 MiB)."""
    import hashlib

    head, keep = Path(args.work) / "head", Path(args.work) / "keep"
    keep.mkdir(exist_ok=True)
    record: dict[str, Any] = {}
    for name in ("head.json", "head.safetensors", *(f"ckpt/{n}" for n in CORPUS_FILES)):
        data = (head / name).read_bytes()
        name = Path(name).name
        pieces = [data[i:i + KEEP_CHUNK] for i in range(0, len(data), KEEP_CHUNK)]
        for n, piece in enumerate(pieces):
            (keep / f"{name}.{n:02d}").write_bytes(piece)
        record[name] = {"sha256": hashlib.sha256(data).hexdigest(), "pieces": len(pieces), "bytes": len(data)}
    (keep / "keep.json").write_text(json.dumps(record, indent=1))
    result["keep"] = record


def _rate(part: list[dict[str, Any]], label: str) -> float:
    """New tokens after the first over decode time, summed over the rows (stats.py's tokens_per_s, pooled)."""
    tokens = sum(r[label]["stats"]["new_tokens"] - 1 for r in part)
    return tokens / sum(r[label]["stats"]["decode_s"] for r in part)


def tree_export_command(args: argparse.Namespace, drafter: list[str], out: Path, graphs_name: str) -> list[str]:
    """spec-export of a tree pack (TREE_NODES nodes, static, fp16) on `graphs_name`: the builder's graphs, or torch's
    with GroupQueryAttention taking the tree mask as attention_bias."""
    graphs = ["--graphs", "builder", "--ep", "cuda"] if graphs_name == "builder" else ["--attention", "gqa"]
    return [sys.executable, "-m", "specpack", "export", "--target", args.target_gguf, *drafter, "-o", str(out),
            "--kv-cache", "static", *graphs, "--dtype", "fp16", "--k", "8", "--max-len", str(MAX_LEN),
            "--max-tree-nodes", str(TREE_NODES), "--dequantize", "--overwrite"]


def start_tree_export(args: argparse.Namespace) -> subprocess.Popen[bytes]:
    """The prompt-lookup tree pack's export, started in the background (log: WORK/tree-export.log)."""
    work = Path(args.work)
    log_file = (work / "tree-export.log").open("wb")
    return subprocess.Popen(tree_export_command(args, ["--drafter", "ngram"], work / "pack-tree", args.tree_graphs),
                            stdout=log_file, stderr=subprocess.STDOUT)


def phase_trees(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Prompt lookup, chains vs trees, on the tree pack (exported beside the training), or on the head's tree pack
    when `headtrees` ran before and no training started one (prompt lookup runs on every pack: one export less)."""
    work = Path(args.work)
    proc = getattr(args, "tree_export", None)
    pack_dir = work / "pack-tree"
    if proc is None and not (pack_dir / "manifest.json").is_file():
        if (work / "pack-head-tree" / "manifest.json").is_file():
            pack_dir = work / "pack-head-tree"
        else:
            proc = start_tree_export(args)
    code = 0 if proc is None else proc.wait()
    if code:
        tail = (work / "tree-export.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"tree export exit {code}: {tail}")
    result["trees"] = {"pack": pack_dir.name, **tree_runs(args, pack_dir, "ngram", TREE_RUNS, args.tree_graphs)}


def phase_headtrees(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The trained head drafting chains and EAGLE-2 trees (docs/heads.md, "Trees drafted by the head") on a tree pack
    of the head (exported here, after training)."""
    work = Path(args.work)
    t0 = time.perf_counter()
    command = tree_export_command(args, ["--draft-head", str(work / "head")], work / "pack-head-tree", args.tree_graphs)
    subprocess.run(command, check=True)
    result["headtrees"] = {"export_s": time.perf_counter() - t0,
                           **tree_runs(args, work / "pack-head-tree", "head", HEAD_TREE_RUNS, args.tree_graphs)}


def tree_runs(args: argparse.Namespace, pack_dir: Path, drafter: str, runs: list[tuple[str, int | None, int | str]],
              graphs: str) -> dict[str, Any]:
    """Each run (label, k, tree) of `drafter` on the 8 prompts, back to back per prompt, 128 tokens, greedy; the first
    is AR (k 0). Returns rows, a summary (tokens/s, speedup over the first, tau, identical) and the capture report."""
    import specpack as sp

    pack = sp.load(pack_dir, device=args.device)
    encoded = [(p, pack.encode(p.text, chat=p.chat)) for p in gpu.real_prompts(args)]
    for _, k, tree in runs:
        pack.generate(encoded[0][1], 32, k=k, drafter=drafter, tree=tree)  # type: ignore[arg-type]
    rows = []
    for prompt, ids in encoded:
        row: dict[str, Any] = {"id": prompt.id}
        for label, k, tree in runs:
            out = pack.generate(ids, 128, k=k, drafter=drafter, tree=tree)  # type: ignore[arg-type]
            row[label] = {"tokens": out.tokens, "stats": dict(out.stats)}
        row["identical"] = {label: row[label]["tokens"] == row[runs[0][0]]["tokens"] for label, _, _ in runs}
        rows.append(row)
        log(f"{prompt.id}: " + ", ".join(f"{label} {row[label]['stats'].get('tokens_per_s', 0):.0f}"
                                         for label, _, _ in runs))
    ar = _rate(rows, runs[0][0])
    summary = {"ar_tokens_per_s": ar, **{label: {
        "tokens_per_s": _rate(rows, label), "speedup": _rate(rows, label) / ar,
        "tau": sum(r[label]["stats"]["new_tokens"] for r in rows) / max(1, sum(r[label]["stats"]["steps"] for r in rows)),
        "identical": sum(r["identical"][label] for r in rows)} for label, _, _ in runs[1:]}}
    log(json.dumps(summary, indent=1))
    capture = getattr(pack.backend, "capture_report", dict)()
    pack.close()
    return {"nodes": TREE_NODES, "graphs": graphs, "rows": rows, "summary": summary, "capture": capture}


def summarize(rows: list[dict[str, Any]], costs: dict[str, Any], runs: list[tuple[str, str, int | None]]
              ) -> dict[str, Any]:
    """Per configuration, over all prompts and per set: tokens/s (new tokens over decode time), speedup over ar,
    alpha, tau, and for fixed k the predicted speedup tau / (k c + v(k)) (c: 0 for prompt lookup)."""
    out: dict[str, Any] = {}
    sets = {"all": rows, "HumanEval": [r for r in rows if "HumanEval" in str(r["id"])],
            "mt_bench": [r for r in rows if "HumanEval" not in str(r["id"])]}
    for name, part in sets.items():
        if not part:
            continue

        def rate(label: str, part: list[dict[str, Any]] = part) -> float:
            return _rate(part, label)

        ar = rate("ar")
        entry: dict[str, Any] = {"ar_tokens_per_s": ar}
        for label, drafter, k in runs[1:]:
            stats = [r[label]["stats"] for r in part]
            verifies = sum(s.get("steps", 0) for s in stats)
            tau = sum(s["new_tokens"] for s in stats) / verifies if verifies else None
            proposed, accepted = sum(s.get("proposed", 0) for s in stats), sum(s.get("accepted", 0) for s in stats)
            item = {"tokens_per_s": rate(label), "speedup": rate(label) / ar, "tau": tau,
                    "alpha": accepted / proposed if proposed else None,
                    "identical": sum(r["identical"][label] for r in part)}
            if k and tau:
                c = costs["c"] if drafter == "head" else 0.0
                item["predicted"] = tau / (k * c + costs["v"][str(k)])
            entry[label] = item
        out[name] = entry
    return out


def phase_genai(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """bench/gpu.py's genai phase on the head pack's target (its speculative mode needs a draft model: not run)."""
    from specpack.contract.manifest import Manifest

    work = Path(args.work)
    pack_dir = work / "pack-head"
    link = gpu.pack_dir_of(args, "real")  # where phase_genai reads the tokenizer
    if not link.exists():
        link.symlink_to(pack_dir.resolve())
    shared = {"real": {"source_dirs": {"target": Manifest.read(pack_dir).target.source.resolved}}}
    try:
        gpu.phase_genai(args, shared)
    except KeyError as err:  # its speculative configuration needs a draft (none here)
        log(f"genai speculative not run: {err!r}")
    result["genai"] = shared["real"].get("peers", {})


def phase_arprofile(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Our k 0 step (the head pack's verify) and onnxruntime-genai's autoregressive step (its builder model, CUDA
    graphs; after `genai`, which builds it) on the first decode prompt, AR_PROFILE_TOKENS tokens each, under PyTorch's
    profiler (head_step_cost.py): kernels and copies per token beside the wall time per token, and the largest kernels.
    Run G: our AR 2.61 ms a token, the peer's 2.24: where the difference goes."""
    from head_step_cost import device_profiler, kernel_summary

    import specpack as sp
    from specpack.runtime.backend import BackendOptions

    work = Path(args.work)
    prompt = gpu.real_prompts(args)[0]
    pack = sp.load(work / "pack-head", device=args.device)
    ids = pack.encode(prompt.text, chat=prompt.chat)
    pack.generate(ids, AR_PROFILE_TOKENS, k=0)  # every run shape captured before the profile
    with device_profiler() as prof:
        t0 = time.perf_counter()
        out = pack.generate(ids, AR_PROFILE_TOKENS, k=0)
        wall = time.perf_counter() - t0
    entry: dict[str, Any] = {"tokens": AR_PROFILE_TOKENS, "prompt": prompt.id, "prompt_tokens": len(ids),
                             "ours": kernel_summary(prof, len(out.tokens), wall), "ours_stats": dict(out.stats)}
    pack.close()
    # the same without the pad row (BackendOptions.pad_single_steps: one row alone, as the peer runs it)
    pack = sp.load(work / "pack-head", device=args.device, options=BackendOptions(pad_single_steps=False))
    pack.generate(ids, AR_PROFILE_TOKENS, k=0)
    with device_profiler() as prof:
        t0 = time.perf_counter()
        one_row = pack.generate(ids, AR_PROFILE_TOKENS, k=0)
        wall = time.perf_counter() - t0
    entry["ours_one_row"] = kernel_summary(prof, len(one_row.tokens), wall)
    entry["one_row_identical"] = one_row.tokens == out.tokens
    pack.close()
    target = work / "genai-real-target"
    if (target / "genai_config.json").exists():
        import onnxruntime_genai as og

        model = gpu.with_graphs(target, True)

        def generate() -> int:
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=len(ids) + AR_PROFILE_TOKENS, do_sample=False)
            generator = og.Generator(model, params)
            generator.append_tokens(ids)
            n = 0
            while not generator.is_done():
                generator.generate_next_token()
                n += 1
            return n

        generate()  # its graph captured
        with device_profiler() as prof:
            t0 = time.perf_counter()
            n = generate()
            wall = time.perf_counter() - t0
        entry["onnxruntime_genai"] = kernel_summary(prof, n, wall)
    result["arprofile"] = entry
    log(json.dumps({name: {key: entry[name][key] for key in ("wall_us_per_run", "kernel_us_per_run", "launches_per_run")}
                    for name in ("ours", "ours_one_row", "onnxruntime_genai") if name in entry}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True)
    parser.add_argument("--target-gguf", required=True)
    parser.add_argument("--draft-gguf", help="the 0.5B draft model's GGUF (the `model` phase)")
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--train-minutes", type=float, default=6.0)
    parser.add_argument("--train-steps", type=int, default=0, help="the training's steps (0: from --train-minutes)")
    parser.add_argument("--data", default="--self-prompts 1024 --self-instruct 4096 --stdlib-tokens 1000000 "
                                          "--generation-batch 256",
                        help="the distill data options (the first runs: --self-prompts 512 --stdlib-tokens 2000000)")
    parser.add_argument("--graphs", choices=("torch", "builder"), default="torch", help="the head pack's target graph")
    parser.add_argument("--corpus", help="a folder with an earlier run's corpus.npz / .json / .key.json (keep phase)")
    parser.add_argument("--train-batch", type=int, default=8, help="distill --batch (sequences of 512 tokens a step)")
    parser.add_argument("--tree-graphs", choices=("torch", "builder"), default="builder",
                        help="the tree packs' target graphs (torch: --attention gqa)")
    parser.add_argument("--device", default="cuda", help="where the packs run (cpu: a dry run of the decode phases)")
    parser.add_argument("--phases", default="card,train,export,decode,genai")
    args = parser.parse_args()
    args.k, args.quantize, args.spec_only, args.rebuild_spec = 4, "none", False, False  # what gpu.phase_genai reads
    Path(args.work).mkdir(parents=True, exist_ok=True)
    out = Path(args.json)
    result: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    phases = {"card": lambda: result.__setitem__("card", gpu.card()), "train": lambda: phase_train(args, result),
              "export": lambda: phase_export(args, result), "decode": lambda: phase_decode(args, result),
              "genai": lambda: phase_genai(args, result), "specbench": lambda: phase_specbench(args, result),
              "specbench-lazy": lambda: phase_specbench(args, result, lazy_capture=True),
              "specbench-trees": lambda: phase_specbench(args, result, trees=True),
              "trees": lambda: phase_trees(args, result), "keep": lambda: phase_keep(args, result),
              "headcost": lambda: phase_headcost(args, result),
              "headtrees": lambda: phase_headtrees(args, result),
              "arprofile": lambda: phase_arprofile(args, result),
              "scatter-ab": lambda: phase_scatter_ab(args, result),
              "treecost": lambda: phase_treecost(args, result),
              "model": lambda: phase_model(args, result)}
    for name in args.phases.split(","):
        t0 = time.perf_counter()
        try:
            phases[name]()
        except Exception as err:  # record it, go on with the next phase
            result.setdefault("errors", {})[name] = repr(err)
            log(f"phase {name} failed: {err!r}")
        result.setdefault("phase_s", {})[name] = time.perf_counter() - t0
        out.write_text(json.dumps(result, indent=1, default=str))
        log(f"phase {name}: {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
