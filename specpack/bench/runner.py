"""Run the benchmark: every prompt decoded by the target alone (k = 0) and speculatively (each k of the
sweep), on one loaded pack, in one run; then the HF-side extras (divergence logit gaps, peers), each in a
child process once the pack is closed, so that their memory is neither ours nor added to ours.

    load pack -> encode prompts -> warm up -> c, v(k) (timing.py)
      -> per prompt: k = 0, then each fixed k, then adaptive k ("auto")   (progress bar on stderr)
      -> close pack -> logit gaps of divergences, --peer hf (peer_hf.py, child processes)
"""

from __future__ import annotations

import gc
import os
import statistics
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specpack.bench.timing import StepCosts, measure_step_costs
from specpack.errors import SpecpackError
from specpack.limits import K_AUTO, TREE_AUTO, TREE_OFF, TreeOption, check_k
from specpack.prompts import BenchPrompt
from specpack.runtime.request import GREEDY, MAX_NEW_TOKENS, GenerateRequest

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from specpack.contract.manifest import Quantization
    from specpack.runtime.pack import Pack

WARMUP_TOKENS = 8


@dataclass(frozen=True)
class BenchConfig:
    ks: tuple[int | None, ...] | None = None  # the k sweep, None in it: adaptive k ("auto"); None: k_max and auto
    max_new_tokens: int = MAX_NEW_TOKENS
    temperature: float = GREEDY.temperature  # 0: greedy
    seed: int = 0                       # uniforms' seed when sampling; the same for k = 0 and every k
    threads: int | None = None          # ONNX Runtime intra-op threads (None: its default) and torch's in peers
    device: str = "cpu"                 # the backend (runtime/backend.py): cpu, cuda, reference
    timing_reps: int = 15               # repetitions of each timed call for c and v(k)
    peer: str | None = None             # "hf": transformers' generate and assisted generation
    drafter: str | None = None          # "model" | "ngram" (runtime/ngram_drafter.py); None: the pack's own
    tree: TreeOption = TREE_AUTO        # every speculative run's tree ("auto" | "off" | N nodes: with k auto only)
    repeat: int = 1                     # decodes of each prompt at each k (k = 0 too): median and spread reported

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def request(self, pack: Pack, ids: list[int], k: int | None, max_new_tokens: int | None = None) -> GenerateRequest:
        """One decode of the run on `pack`: `ids` with k drafts per step (None: adaptive), the run's drafter, tree
        (k = 0, the target alone: none), temperature and seed."""
        n = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        return GenerateRequest.of(ids, n, k=k, drafter=self.drafter, temperature=self.temperature, seed=self.seed,
                                  tree=TREE_OFF if k == 0 else self.tree, limits=pack.limits)


@dataclass(frozen=True)
class Decode:
    """One generation: its new tokens and the runtime's stats (DecodeStats.to_dict())."""

    tokens: list[int]
    stats: dict[str, Any]


@dataclass
class PromptRun:
    prompt: BenchPrompt
    ids: list[int]                              # prompt token ids, as the pack encoded them
    ar: Decode                                  # k = 0: the target alone (the first of --repeat decodes)
    spec: dict[int | str, Decode] = field(default_factory=dict)  # by k; adaptive k under K_AUTO ("auto")
    again: list[dict[int | str, Decode]] = field(default_factory=list)  # --repeat 2..N, by k (0: the target alone)

    def decodes(self, k: int | str) -> list[Decode]:
        """Every decode at `k` (0: the target alone), the first one first: --repeat of them."""
        return [self.ar if k == 0 else self.spec[k], *(rep[k] for rep in self.again)]


@dataclass
class BenchRun:
    config: BenchConfig
    ks: tuple[int, ...]                         # the fixed ks swept (sorted; may be empty when auto is run)
    pack: dict[str, Any]                        # path, k_max, max_len, dtype, eos ids, sources
    runs: list[PromptRun]
    costs: StepCosts
    peak_memory: dict[str, Any]
    skipped: list[dict[str, str]] = field(default_factory=list)
    gaps: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)  # (prompt id, position) -> gap
    peers: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    auto: bool = False                          # adaptive k was run too (PromptRun.spec["auto"])


def run_bench(pack_path: Path, prompts: Sequence[BenchPrompt], config: BenchConfig,
              progress: Progress | None = None) -> BenchRun:
    """Load, time c and v(k), decode every prompt (k = 0 and each k); report.py turns the result into numbers.

    The HF-side extras come after, from `add_hf_extras`, once the pack is closed and the progress bar is gone.
    """
    from specpack.runtime.pack import load

    task = progress.add_task("loading the pack", total=None) if progress is not None else None
    memory = PhaseMemory()
    with memory:
        with memory.phase("load"):
            pack = load(pack_path, device=config.device, threads=config.threads)
        ks, auto = check_ks(config.ks, pack.manifest.k_max, isinstance(config.tree, int))
        pack.check_tree(pack.drafter_named(config.drafter)[0], config.tree)
        timed = ks or (pack.manifest.k_max,)  # adaptive k alone: c and v(k_max)
        encoded, skipped = _encode_all(pack, prompts, config.max_new_tokens)
        _show(progress, task, description="warm-up, then timing c and v(k)")
        with memory.phase("timing"):
            _warm_up(pack, encoded[0][1], sweep(ks, auto), config)
            costs = measure_step_costs(pack, timed, _timing_context(encoded, config, pack, timed), encoded[0][1],
                                       reps=config.timing_reps,
                                       with_draft=pack.drafter_named(config.drafter)[0] == "model")
        _show(progress, task, total=len(encoded) * (1 + len(ks) + auto) * config.repeat)
        runs = _decode_all(pack, encoded, sweep(ks, auto), config, memory, progress, task)
        info = _pack_info(pack, pack_path, config)
        pack.close()
        del pack
        gc.collect()
    return BenchRun(config, ks, info, runs, costs, memory.report(), skipped, notes=_repeat_notes(runs), auto=auto)


def check_ks(ks: Sequence[int | None] | None, k_max: int, fixed_tree: bool = False) -> tuple[tuple[int, ...], bool]:
    """The k sweep: (the fixed ks sorted, each in 1..k_max; whether adaptive k, None in `ks`, is run). k = 0, the
    target alone, is always run beside them. None (no --k): the pack's k_max and adaptive k; with a fixed tree
    (--tree N, which fixes every step's nodes) auto alone, and a fixed k is refused."""
    if fixed_tree and any(k is not None for k in ks or ()):
        raise SpecpackError("--tree N and a fixed --k both fix a step's drafts", expected=f"--k {K_AUTO} with --tree N",
                            found=f"--k {','.join(K_AUTO if k is None else str(k) for k in ks or ())}",
                            hint="sweep chains with --tree off --k 1,2,4, or trees with --tree auto --k 1,2,4")
    if ks is None:
        return ((), True) if fixed_tree else ((k_max,), True)
    if not ks:
        raise SpecpackError("invalid --k", expected="at least one k", found="nothing")
    return tuple(sorted({check_k(k, k_max, minimum=1, what="--k") for k in ks if k is not None})), None in ks


def sweep(ks: tuple[int, ...], auto: bool) -> tuple[int | None, ...]:
    """What each prompt is decoded with after k = 0: the fixed ks, then adaptive k (None, Pack.generate's k)."""
    return (*ks, None) if auto else ks


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first new token where two outputs differ (a shorter output differs where it ends)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _encode_all(pack: Pack, prompts: Sequence[BenchPrompt],
                max_new_tokens: int) -> tuple[list[tuple[BenchPrompt, list[int]]], list[dict[str, str]]]:
    """Token ids of each prompt; those too long for the pack are skipped (and reported), not truncated."""
    encoded, skipped = [], []
    limit = pack.manifest.max_len
    for p in prompts:
        ids = pack.encode(p.text, chat=p.chat)
        if len(ids) + max_new_tokens > limit:
            skipped.append({"prompt": p.id, "reason": f"{len(ids)} prompt tokens + {max_new_tokens} > max_len {limit}"})
        else:
            encoded.append((p, ids))
    if not encoded:
        raise SpecpackError("no prompt fits the pack", expected=f"prompt tokens + --max-new-tokens <= {limit}",
                            found=f"{len(skipped)} prompts, all too long", hint="lower --max-new-tokens")
    return encoded, skipped


def _warm_up(pack: Pack, ids: list[int], ks: tuple[int | None, ...], config: BenchConfig) -> None:
    """First runs allocate ONNX Runtime's arenas: keep them out of the measured numbers."""
    for k in (0, *ks):
        pack.generate_request(config.request(pack, ids, k, WARMUP_TOKENS))


def _timing_context(encoded: list[tuple[BenchPrompt, list[int]]], config: BenchConfig, pack: Pack,
                    ks: tuple[int, ...]) -> int:
    """Context for c and v(k): the median prompt plus half the new tokens, where decoding spends its time."""
    typical = int(statistics.median(len(ids) for _, ids in encoded)) + config.max_new_tokens // 2
    return max(1, min(typical, pack.manifest.max_len - max(ks) - 2))


def _decode_all(pack: Pack, encoded: list[tuple[BenchPrompt, list[int]]], ks: tuple[int | None, ...], config: BenchConfig,
                memory: PhaseMemory, progress: Progress | None, task: TaskID | None) -> list[PromptRun]:
    """Per prompt, --repeat rounds of (k = 0, each k): a slow moment of the machine falls on every k alike."""
    runs = []
    for prompt, ids in encoded:
        rounds: list[dict[int | str, Decode]] = []
        for r in range(config.repeat):
            decodes: dict[int | str, Decode] = {}
            for k in (0, *ks):
                key = K_AUTO if k is None else k
                again = f" (repeat {r + 1}/{config.repeat})" if config.repeat > 1 else ""
                _show(progress, task, description=f"{prompt.id} k={key}{again}")
                with memory.phase("autoregressive" if k == 0 else "speculative"):
                    out = pack.generate_request(config.request(pack, ids, k))
                decodes[key] = Decode(out.tokens, out.stats)
                _show(progress, task, advance=1)
            rounds.append(decodes)
        first = rounds[0]
        runs.append(PromptRun(prompt, ids, first[0], {k: d for k, d in first.items() if k != 0}, rounds[1:]))
    return runs


def _repeat_notes(runs: Sequence[PromptRun]) -> list[str]:
    """A repeat whose tokens differ from the first decode's (same seed): the backend is not deterministic here."""
    differ = sorted({f"{r.prompt.id} k={k}" for r in runs for rep in r.again for k, d in rep.items()
                     if d.tokens != r.decodes(k)[0].tokens})
    if not differ:
        return []
    return [f"--repeat: {len(differ)} decodes gave other tokens than their first run with the same seed "
            f"({', '.join(differ[:5])}{', ...' if len(differ) > 5 else ''}); alpha, tau and identity are the first run's"]


def _show(progress: Progress | None, task: TaskID | None, **fields: Any) -> None:
    if progress is not None and task is not None:
        progress.update(task, **fields)


def _pack_info(pack: Pack, path: Path, config: BenchConfig) -> dict[str, Any]:
    m, draft = pack.manifest, pack.manifest.draft_model  # draft None: a pack without a draft model (n-gram)
    return {"path": str(path), "device": config.device, "k_max": m.k_max, "max_len": m.max_len, "dtype": m.target.dtype,
            "draft_dtype": draft and draft.dtype, "quantization": m.quantization,
            "eos_token_ids": list(m.eos_token_ids),
            "draft_quantization": quantization_brief(draft.quantization) if draft else None,
            "target_quantization": quantization_brief(m.target.quantization),
            "draft_source": dict(draft.source) if draft else {}, "target_source": dict(m.target.source),
            "threads": config.threads, "drafter": pack.drafter_named(config.drafter)[0], "tree": config.tree,
            "max_tree_nodes": pack.max_nodes}


def quantization_brief(record: Quantization | None) -> dict[str, Any] | None:
    """A model's quantization record without the per-tensor list: method, settings, paths taken, fidelity."""
    if record is None:
        return None
    return record.model_dump(mode="json", exclude={"tensors"})


def add_hf_extras(run: BenchRun) -> None:
    """Logit gaps at every greedy divergence, and the transformers peer: both in child processes."""
    from specpack.bench import peer_hf

    threads = run.config.threads or _physical_cores()
    target_dir, draft_dir = run.pack["target_source"].get("resolved"), run.pack["draft_source"].get("resolved")
    # another model at a source path would be measured as if it were the pack's: only the recorded files are run
    other = {role: peer_hf.source_mismatch(run.pack[f"{role}_source"]) for role in ("target", "draft")}
    run.notes += [f"transformers not run on the {role}'s source model: {why}" for role, why in other.items() if why]
    requests = _gap_requests(run) if run.config.greedy and not other["target"] else []
    if requests:
        gaps, note = peer_hf.logit_gaps(target_dir, requests, threads=threads, dtype=run.pack["dtype"])
        run.gaps = {(g["prompt"], g["position"]): g for g in gaps}
        run.notes += [note] if note else []
    if run.config.peer == "hf" and not any(other.values()):
        peer, note = peer_hf.run_hf_peer(draft_dir, target_dir, run, threads=threads)
        run.peers = {"hf": peer} if peer is not None else {}
        run.notes += [note] if note else []


def add_llamacpp_peer(run: BenchRun, tools_dir: Path | None) -> None:
    """llama.cpp on the pack's GGUF sources, same prompts, tokens and threads, drafting up to the largest k."""
    from specpack.bench.peer_llamacpp import run_llamacpp_peer

    try:
        peer, note = run_llamacpp_peer(run, tools_dir, max(run.ks, default=run.pack["k_max"]))
    except SpecpackError as err:  # a peer that fails (e.g. crashes) is reported; our own results are kept
        peer, note = None, f"--peer llamacpp failed: {err.what} (found: {err.found})"
    if peer is not None:
        run.peers["llamacpp"] = peer
    run.notes += [note] if note else []


def _gap_requests(run: BenchRun) -> list[dict[str, Any]]:
    """One request per distinct (prompt, position) where a speculative output left the target-alone one."""
    requests: dict[tuple[str, int], dict[str, Any]] = {}
    for r in run.runs:
        for d in r.spec.values():
            pos = first_divergence(r.ar.tokens, d.tokens)
            if pos is not None and (r.prompt.id, pos) not in requests:
                requests[(r.prompt.id, pos)] = {"prompt": r.prompt.id, "position": pos,
                                                "prefix": r.ids + r.ar.tokens[:pos]}
    return list(requests.values())


def _physical_cores() -> int:
    try:
        import psutil

        return int(psutil.cpu_count(logical=False) or os.cpu_count() or 1)
    except ImportError:
        return os.cpu_count() or 1


class PhaseMemory:
    """Peak resident memory of this process in each phase, sampled by a background thread.

    A phase's peak is the process RSS (everything alive, the loaded pack included), not a delta;
    ru_maxrss would give only the lifetime peak.
    """

    INTERVAL_S = 0.01

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self._phase: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, name="bench-rss", daemon=True)
        self.before = _rss()

    def __enter__(self) -> PhaseMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._phase = name
        self._sample()
        try:
            yield
        finally:
            self._sample()
            self._phase = None

    def report(self) -> dict[str, Any]:
        import resource

        lifetime_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        return {"rss_before_load_mb": self.before / 2**20,
                "peak_rss_mb": {name: rss / 2**20 for name, rss in self.peaks.items()},
                "process_lifetime_max_rss_mb": lifetime_kb / 1024,
                "method": f"process RSS sampled every {self.INTERVAL_S * 1e3:.0f} ms, max per phase"}

    def _sample(self) -> None:
        phase = self._phase
        if phase is not None:
            self.peaks[phase] = max(self.peaks.get(phase, 0), _rss())

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            self._sample()


def _rss() -> int:
    """Resident set size of this process in bytes (/proc: no dependency, ~10 us)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import psutil

        return int(psutil.Process().memory_info().rss)

