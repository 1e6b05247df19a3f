"""A loaded pack: wiring only. Manifest and integrity check, tokenizer, backend, drafters and k policy.

    load(path, device="cpu") -> Pack -> generate(prompt) -> Generation(tokens, text, stats, finish_reason)

Drafters: "model" (the pack's draft model; packs exported with one), "head" (the pack's draft head: packs exported
with --draft-head) and "ngram" (prompt lookup: every pack).
k: None is "auto" (AdaptiveK, the default), an int N is N drafts every step (FixedK; 0: the target alone).
tree: "auto" (the default) sizes token trees per step (TreePolicy) where the pack has a tree verify graph and the drafter
drafts trees (the n-gram drafter, a tree pack's head, a tree pack's draft model in its tree form); "off" drafts chains; N
is N nodes every step (FixedTree).
docs/trees.md.

Thread safety (docs/architecture.md, "Threads"): one lock per Pack around each generation.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specpack.contract.integrity import verify_pack
from specpack.contract.manifest import Manifest
from specpack.errors import SpecpackError
from specpack.limits import DRAFTERS, TREE_AUTO, TREE_OFF, TreeOption, check_tree
from specpack.names import TOKENIZER_DIR
from specpack.runtime.adaptive_k import AcceptanceModel, AdaptiveConfig, AdaptiveK, Costs, PackAcceptance, PriorCosts
from specpack.runtime.backend import Backend, BackendOptions, open_backend
from specpack.runtime.batcher import Batcher, Handle
from specpack.runtime.drafter import Drafter, HeadDrafter, ModelDrafter
from specpack.runtime.k_policy import FixedK, KPolicy
from specpack.runtime.loop import decode
from specpack.runtime.ngram_drafter import NgramConfig, NgramDrafter
from specpack.runtime.request import GREEDY, MAX_NEW_TOKENS, DrafterError, GenerateRequest, PreparedRequest
from specpack.runtime.scheduler import PREFILL_CHUNK
from specpack.runtime.state import DecodeState
from specpack.runtime.stats import DecodeStats, Stats
from specpack.runtime.stop_strings import TextOut
from specpack.runtime.tokenizer import CONFIG_FILE, TOKENIZER_FILE, PackTokenizer
from specpack.runtime.tree_policy import FixedTree, TreeAcceptance, TreePolicy
from specpack.sampling import SamplingParams, Uniforms
from specpack.validation import PackLimits, brief, check_context, check_load_args, check_prompt

# the draft phase per draft in target steps, where the k schedule must not follow the clock (seeded sampling)
PRIOR_DRAFT_COST = {"model": 0.5, "ngram": 0.0, "head": 0.15}


@dataclass
class Generation:
    tokens: list[int]                 # new token ids, ending with the eos id when one ended generation
    text: str                         # their text, special tokens skipped
    stats: Stats = field(default_factory=Stats)  # a dict whose keys read as attributes too: stats.alpha
    finish_reason: str = "length"     # "eos" | "length" (max_new_tokens reached) | "stop" (a stop string) | "cancelled"

    def __post_init__(self) -> None:
        if not isinstance(self.stats, Stats):  # a plain dict given: the same keys, readable as attributes
            self.stats = Stats(self.stats)


def load(path: str | os.PathLike[str], *, device: str = "cpu", threads: int | None = None,
         manifest_sha256: str | None = None, ngram: NgramConfig | None = None,
         options: BackendOptions | None = None) -> Pack:
    """Open a pack: check every file against the manifest, then load the tokenizer and the backend.

    device: a registered backend ("cpu", "cuda", "reference"; runtime/backend.py). threads: intra-op threads
    per session (None: ONNX Runtime's default, or the CPUs the process's affinity allows: ort_session.py). The
    draft model is opened on its first use (pinned: at load).
    `manifest_sha256` (printed by `specpack inspect`) pins the pack: any other manifest is refused, every file is
    hashed (the `.verified.json` stamp is not trusted), and the graphs, their external data and the tokenizer are
    handed over as the very bytes that were hashed, every graph opened at load (docs/security.md).
    `ngram`: the n-gram drafter's n range (default NgramConfig()).
    `options`: the backend's other options (runtime/backend.py's BackendOptions: pad_single_steps, cuda_graphs;
    what bench measures); `threads` and the pin override its fields.
    """
    path = Path(check_load_args(path, threads))
    if ngram is not None and not isinstance(ngram, NgramConfig):
        raise SpecpackError("invalid ngram", expected="an NgramConfig(n_min, n_max), or None", found=repr(ngram)[:80],
                            hint="from specpack.runtime.ngram_drafter import NgramConfig; ngram=NgramConfig(2, 4)")
    if options is not None and not isinstance(options, BackendOptions):
        raise SpecpackError("invalid options", expected="a BackendOptions(...), or None", found=repr(options)[:80],
                            hint="from specpack.runtime.backend import BackendOptions")
    pinned = manifest_sha256 is not None
    manifest = Manifest.read(path, sha256=manifest_sha256)
    # pinned: what the runtime reads is hashed as it is read (contract/verified_read.py); every other file here
    verify_pack(path, manifest, full=pinned, deferred=set(manifest.loaded_files()) if pinned else ())
    tokenizer = _load_tokenizer(path, manifest, pinned)
    options = replace(options or BackendOptions(), threads=threads, verified_reads=pinned)
    backend = open_backend(device, path, manifest, options)
    return Pack(path, manifest, tokenizer, backend, ngram=ngram, slots=options.slots,
                padded_k0=options.pad_single_steps)


def _load_tokenizer(path: Path, manifest: Manifest, pinned: bool) -> PackTokenizer:
    """The pack's tokenizer; pinned: from its files' bytes, hashed as they are read."""
    if not pinned:
        return PackTokenizer.load(path / TOKENIZER_DIR)
    from specpack.contract.verified_read import read_verified

    config, tokenizer = (read_verified(path, manifest.file_entry(f"{TOKENIZER_DIR}/{name}"))
                         for name in (CONFIG_FILE, TOKENIZER_FILE))
    return PackTokenizer.from_bytes(config, tokenizer, path / TOKENIZER_DIR)


class Pack:
    """A loaded pack, safe to share between threads.

    Guarantee: `generate` may be called from any number of threads at once. One lock per pack serialises the
    generations (one runs at a time; the others wait, in no particular order), so every call returns exactly
    what it would return alone. Encoding the prompt and decoding the text run outside the lock; `on_text`
    runs inside it, on the calling thread, and must not call `generate` on the same pack (that raises a
    SpecpackError rather than deadlocking). `close` waits for a running generation; after it, `generate` raises a
    SpecpackError (closing twice is harmless); `with specpack.load(PATH) as pack:` closes it on leaving. The backend, the drafter
    and the tokenizer's stream are not thread-safe themselves: reach the backend only through `exclusive()`.
    """

    def __init__(self, path: Path, manifest: Manifest, tokenizer: PackTokenizer, backend: Backend,
                 drafter: Drafter | None = None, ngram: NgramConfig | None = None, slots: int = 1,
                 padded_k0: bool = True) -> None:
        """`drafter` replaces the pack's default drafter (the manifest's: "model" or "ngram"); `padded_k0`: the backend
        runs a greedy single step as k = 1's two rows (BackendOptions.pad_single_steps), which adaptive k's cost model
        then assumes of k = 0 until it is measured (AdaptiveConfig.padded_k0)."""
        self.path, self.manifest, self.tokenizer, self.backend = path, manifest, tokenizer, backend
        self.drafters: dict[str, Drafter] = {"ngram": NgramDrafter(ngram)}
        if manifest.drafter == "model":
            self.drafters["model"] = ModelDrafter(backend.draft, chain_max=manifest.k_max)
        if manifest.drafter == "head":
            self.drafters["head"] = HeadDrafter(backend.draft, chain_max=manifest.k_max)
        self.default_drafter: str = manifest.drafter
        if drafter is not None:
            self.drafters[self.default_drafter] = drafter
        self.drafter = self.drafters[self.default_drafter]
        self.eos_ids = frozenset(manifest.eos_token_ids)
        tree = manifest.target.graph.tree
        self.max_nodes = 0 if tree is None else tree.max_nodes  # the most nodes a tree verify takes (0: no trees)
        # (drafter, the policy's most drafts or nodes) -> the step costs adaptive k or the tree policy measured here
        self._costs: dict[tuple[str, int], Costs] = {}
        self._acceptance: dict[str, PackAcceptance] = {}  # drafter -> its chains' acceptance over this pack's requests
        self._tree_acceptance: dict[str, TreeAcceptance] = {}  # drafter -> its trees' acceptance, likewise
        self._lock = threading.Lock()
        self._owner: int | None = None  # the thread holding the lock
        self.closed = False  # set by close(): the backend's sessions are gone
        self._padded_k0 = padded_k0 and manifest.k_max >= 1  # Target pads only where a pack drafts
        self.slots = slots   # the backend's cache slots: the most requests a batch decodes at once
        self._batcher: Batcher[Any] | None = None  # start_batching: the scheduler's thread
        self._batching_lock = threading.Lock()

    @contextmanager
    def exclusive(self) -> Iterator[Backend]:
        """Hold the pack's lock, as a generation does, and get the backend (bench timing drives it directly)."""
        if self._owner == threading.get_ident():
            raise SpecpackError("a generation on this pack was started from inside another one",
                                expected="on_text (or a cancel callback) that does not call generate on the same pack",
                                found="a nested call on the generating thread",
                                hint="collect the text and generate after the call returns")
        with self._lock:
            self._owner = threading.get_ident()
            try:
                yield self.backend
            finally:
                self._owner = None

    def encode(self, prompt: str | Sequence[int], *, chat: bool = False) -> list[int]:
        """Prompt ids: a list of ids as is, a string tokenized as is, or wrapped in the chat template."""
        checked = check_prompt(prompt, chat=chat, vocab_size=self.manifest.vocab_size)
        return checked if not isinstance(checked, str) else self._encode_text(checked, chat)

    def _encode_text(self, text: str, chat: bool) -> list[int]:
        """A checked text prompt's ids, each below the graphs' vocabulary."""
        ids = self.tokenizer.encode_chat(text) if chat else self.tokenizer.encode(text)
        if ids and (top := max(ids)) >= self.manifest.vocab_size:  # the graphs' embedding would fail on it
            raise SpecpackError("the pack's tokenizer gave an id outside the graphs' vocabulary",
                                expected=f"ids below vocab_size {self.manifest.vocab_size}", found=f"id {top}",
                                hint="the tokenizer and the graphs come from different exports: re-export the pack")
        return ids

    def drafter_named(self, name: str | None) -> tuple[str, Drafter]:
        """The drafter `name` ("model" | "head" | "ngram"; None: the pack's default), refused clearly where the pack
        lacks it."""
        if name is None:
            name = self.default_drafter
        if name not in DRAFTERS:
            raise DrafterError(f"unknown drafter {name!r}", expected=" | ".join(DRAFTERS), found=repr(name))
        if name not in self.drafters:
            have = " or ".join(repr(d) for d in self.drafters)
            raise DrafterError(f"this pack has no {'draft head' if name == 'head' else 'draft model'}",
                               expected=f"drafter {have} for this pack",
                               found=f"drafter {name!r}, a pack exported with --drafter {self.default_drafter}",
                               hint="use --drafter ngram, or export the pack with --draft D (a draft model) or "
                                    "--draft-head HEAD (a head)")
        return name, self.drafters[name]

    def policy(self, k: int | None, drafter: str, params: SamplingParams, seed: int | None,
               tree: TreeOption = TREE_AUTO) -> KPolicy:
        """The k policy of one request: k drafts every step (0: the target alone), or None: adaptive; with token trees
        (`trees_for`), k nodes every step or the tree policy, and tree N: N nodes every step.

        Adaptive k and the tree policy follow the step times measured on this machine, except for sampling with a seed,
        where the same seed must give the same tokens: there they follow acceptance alone, with fixed relative costs.
        """
        if self.trees_for(drafter, tree):
            width = self._tree_widths()[drafter]
            if isinstance(tree, int) or k is not None:
                nodes = tree if isinstance(tree, int) else k
                return FixedTree(nodes, width) if nodes else FixedK(0)

            def tree_policy(costs: Costs | None) -> TreePolicy:
                config, pooled = AdaptiveConfig(padded_k0=self._padded_k0), None
                if not isinstance(costs, PriorCosts):  # seeded sampling: this request's acceptance alone
                    pooled = self._tree_acceptance.setdefault(
                        drafter, TreeAcceptance(self.max_nodes, width, config, decay=config.pack_decay))
                return TreePolicy(self.max_nodes, width, config, costs=costs, warmups=self.backend.warmup_runs,
                                  pooled=pooled, chain_max=self.manifest.k_max)

            return self._adaptive(drafter, params, seed, tree_policy, self.max_nodes)
        if k is not None:
            return FixedK(k)
        k_max, config = self.manifest.k_max, AdaptiveConfig(padded_k0=self._padded_k0)

        def chain(costs: Costs | None) -> AdaptiveK:
            pooled = None
            if not isinstance(costs, PriorCosts):  # seeded sampling: acceptance of this request alone (same seed, same k)
                pooled = self._acceptance.setdefault(drafter, PackAcceptance(k_max, config))
            return AdaptiveK(k_max, config, costs=costs, warmups=self.backend.warmup_runs,
                             acceptance=AcceptanceModel(k_max, config, pack=pooled))

        return self._adaptive(drafter, params, seed, chain, k_max)

    def _adaptive(self, drafter: str, params: SamplingParams, seed: int | None,
                  make: Callable[[Costs | None], AdaptiveK], size: int) -> AdaptiveK:
        if not params.greedy and seed is not None:
            return make(PriorCosts(PRIOR_DRAFT_COST[drafter]))
        policy = make(self._costs.get((drafter, size)))
        self._costs[(drafter, size)] = policy.costs  # the step costs measured so far carry over to the next request
        return policy

    def check_tree(self, drafter: str, tree: TreeOption) -> None:
        """A request's tree against this pack and the drafter that runs: a fixed tree needs a tree verify graph of at
        least that many nodes and a drafter that drafts trees ("auto" and "off" suit every pack and drafter)."""
        check_tree(tree, self.max_nodes)
        if isinstance(tree, int) and not self.trees_for(drafter, tree):
            raise SpecpackError(f"the {drafter} drafter drafts chains, not trees",
                                expected="tree 'auto' or 'off' with this drafter, or drafter 'ngram' (its tries) or "
                                         "'head' / 'model' (a tree pack's head or draft model in its tree form) for a "
                                         "fixed tree",
                                found=f"tree {tree}, drafter {drafter!r}",
                                hint="use --drafter ngram --tree N, or --k N for chains")

    def trees_for(self, drafter: str, tree: TreeOption) -> bool:
        """Whether a request drafts token trees: the pack verifies trees, the drafter drafts them (the n-gram drafter's
        tries; a tree pack's head or draft model in its tree form, EAGLE-2's trees; a draft model without it drafts
        chains), and its tree is not "off"."""
        return self.max_nodes > 0 and drafter in self._tree_widths() and tree != TREE_OFF

    def _tree_widths(self) -> dict[str, int]:
        """The drafters that draft trees here, each with the widest tree it drafts (the tree policy's width)."""
        ngram = self.drafters["ngram"]
        widths = {"ngram": ngram.config.width if isinstance(ngram, NgramDrafter) else 1}
        head, draft = self.manifest.head, self.manifest.draft_model
        if head is not None and head.tree_width:  # a tree pack's head (head_tree.py)
            widths["head"] = head.tree_width
        if draft is not None and draft.tree_width and "model" in self.drafters:  # a tree pack's draft model, tree form
            widths["model"] = draft.tree_width
        return widths

    @property
    def limits(self) -> PackLimits:
        m = self.manifest
        return PackLimits(m.k_max, m.vocab_size, m.max_len, self.max_nodes)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = MAX_NEW_TOKENS, *, k: int | None = None,
                 drafter: str | None = None, temperature: float = GREEDY.temperature, top_k: int = GREEDY.top_k,
                 top_p: float = GREEDY.top_p, seed: int | None = None, chat: bool = False, stop: Sequence[str] = (),
                 tree: TreeOption = TREE_AUTO, on_text: Callable[[str], None] | None = None,
                 cancel: threading.Event | None = None) -> Generation:
        """Speculative decoding: k drafts per step (None, the default: adaptive, "auto"; 0: the target alone)
        from `drafter` ("model" | "head" | "ngram"; None: the pack's own, the manifest's `drafter`).

        `tree`: "auto" (the default) drafts token trees sized per step where the pack has a tree verify graph and the
        drafter drafts trees (the n-gram drafter, a tree pack's head or draft model), chains elsewhere; "off": chains; N: N nodes
        every step (refused where the pack takes fewer, or no trees, or the drafter drafts chains; with a fixed k
        too). docs/trees.md.

        Greedy by default; the output distribution is the target's for any sampling parameters, and the same
        seed gives the same tokens. `on_text` receives the text as it is decoded; an exception it raises
        propagates and leaves the pack ready for the next call. `cancel` is checked before every step: once
        set, generation stops within one step with finish_reason "cancelled". `stop`: generation ends right before
        the first of these strings (finish_reason "stop"; the text and on_text end before it). After `close()`: a
        SpecpackError. The typed path: `generate_request(GenerateRequest(...))`.
        """
        request = GenerateRequest.of(prompt, max_new_tokens, k=k, drafter=drafter, temperature=temperature,
                                     top_k=top_k, top_p=top_p, seed=seed, chat=chat, stop=stop, tree=tree,
                                     limits=self.limits)
        return self.generate_request(request, on_text=on_text, cancel=cancel)

    def generate_request(self, request: GenerateRequest, *, on_text: Callable[[str], None] | None = None,
                         cancel: threading.Event | None = None) -> Generation:
        """`generate` for a request made already: prepare it for this pack, then run it."""
        return self.run(self.prepare(request), on_text=on_text, cancel=cancel)

    def prepare(self, request: GenerateRequest) -> PreparedRequest:
        """Check a request against this pack, once: its limits, the drafter it asks for, the prompt encoded, the
        context. The server prepares each request before queueing it, so that every refusal comes before decoding."""
        self._check_open()
        request.check_fits(self.limits)
        name = self.drafter_named(request.drafter)[0]
        self.check_tree(name, request.tree)
        prompt = request.prompt
        ids = tuple(prompt) if not isinstance(prompt, str) else tuple(self._encode_text(prompt, request.chat))
        if not ids:
            raise SpecpackError("empty prompt", expected="at least one token", found="0 tokens")
        check_context(len(ids), request.max_new_tokens, self.manifest.max_len)
        return PreparedRequest(request, ids, name)

    def run(self, prepared: PreparedRequest, *, on_text: Callable[[str], None] | None = None,
            cancel: threading.Event | None = None) -> Generation:
        """Decode a prepared request (Pack.prepare): the generation, under the pack's lock."""
        if on_text is not None and not callable(on_text):
            raise SpecpackError("invalid on_text", expected="a function taking a str, or None", found=brief(on_text))
        if cancel is not None and not callable(getattr(cancel, "is_set", None)):
            raise SpecpackError("invalid cancel", expected="a threading.Event (anything with an is_set() method), or None",
                                found=brief(cancel), hint="pass cancel=threading.Event() and set() it to stop")
        if (batcher := self._batcher) is not None:  # the scheduler owns the slots: the request joins its batch
            if threading.current_thread() is batcher.thread:
                raise SpecpackError("a generation on this pack was started from inside another one",
                                    expected="on_text that does not call generate on the same pack",
                                    found="a nested call on the batching thread",
                                    hint="collect the text and generate after the call returns")
            return self.submit(prepared, on_text=on_text, cancel=cancel).result()
        self._check_open()
        request = prepared.request
        policy = self.policy(request.k, prepared.drafter, request.sampling, request.seed, request.tree)
        text = TextOut(self.tokenizer, request.stop, on_text)

        with self.exclusive() as backend:
            self._check_open()  # closed while this call waited for the lock
            state = self.new_state(prepared, policy)
            finish_reason = decode(state, backend.target(), self.drafters[prepared.drafter], policy,
                                   text.push if text.streaming else None, text.halt(cancel))
        return self.generation(prepared, state, text, finish_reason)

    def new_state(self, prepared: PreparedRequest, policy: KPolicy, slot: int = 0) -> DecodeState:
        """A prepared request's DecodeState on cache slot `slot`, its statistics sized by its k policy."""
        m, request = self.manifest, prepared.request
        params = request.sampling
        width = max(m.k_max, policy.k_max)  # the most drafts or tree nodes one step verifies
        trees = self.trees_for(prepared.drafter, request.tree)
        return DecodeState.start(list(prepared.ids), request.max_new_tokens, params,
                                 Uniforms(params, width, seed=request.seed), eos_ids=self.eos_ids, max_len=m.max_len,
                                 k_max=width, stats=DecodeStats(k=policy.k_max, drafter=prepared.drafter,
                                                                k_policy="fixed" if isinstance(policy, (FixedK, FixedTree))
                                                                else "auto", tree=trees),
                                 slot=slot)

    @staticmethod
    def generation(prepared: PreparedRequest, state: DecodeState, text: TextOut, finish_reason: str) -> Generation:
        """The Generation of a decoded request: its text flushed (stop strings cut), its statistics."""
        stats = state.stats.to_dict()
        stats["prompt_tokens"] = len(prepared.ids)
        finish_reason, out_text = text.finish(finish_reason, state.out)
        return Generation(tokens=state.out, text=out_text, stats=stats, finish_reason=finish_reason)

    def precapture_thread(self) -> int:
        """Capture on the calling thread, under the pack's lock, the shapes its requests will run, where the backend
        captures per thread (the cuda backend: CUDA graphs are kept per thread; docs/cuda_backend.md, "Per thread"):
        for a thread that will call generate / run, e.g. a server's worker. start_batching does it on its own thread.
        The runs made (0: nothing to capture)."""
        with self.exclusive():
            return self.backend.precapture_thread(None, None)

    def start_batching(self, max_batch: int | None = None, *, max_waiting: int = 64,
                       prefill_chunk: int = PREFILL_CHUNK, prefill_budget: int | None = None, batched: Any = None,
                       batched_draft: Any = None, batch_policy: Any = None, solo: bool = True) -> Batcher[Any]:
        """Decode requests together from now on (continuous batching: docs/batching.md): `submit`, and `generate` /
        `run` too, join a running batch of up to `max_batch` requests (None: the backend's cache slots, which bound
        it), with up to `max_waiting` more waiting (past that, submit raises QueueFull). Started once; again: the
        same batcher if the arguments agree. `batched`: a batched target (runtime/batched_verify.py) that verifies
        a step's rows in one run, in place of the backend's per-slot verifies (None: the pack's own, when it was
        exported with --max-batch and the backend opens them: cpu, cuda); `batched_draft`: a
        batched drafter (runtime/batched_draft.py) for the "model" drafter's requests, every row's drafts in one run;
        `batch_policy`: the cap on each row's k (runtime/batch_k.py; None: BatchKCap with `batched`, else NoCap);
        `prefill_chunk`, `prefill_budget`: prompt tokens per prefill run of a row, and per iteration over all rows
        (runtime/scheduler.py; None: one chunk, or where a batched engine's run costs its launch and the iteration's
        prefills run together, scheduler.PREFILL_TOGETHER); `solo`: with a batched target, a request admitted when no
        other is there decodes alone on the per-slot engines, as `generate` does without a batch (runtime/scheduler.py,
        solo rows; False: through the batched graphs at batch 1)."""
        from specpack.runtime.pack_batching import start_batching

        self._check_open()
        with self._batching_lock:
            if self._batcher is None:
                self._batcher = start_batching(self, max_batch or self.slots, max_waiting, prefill_chunk, batched,
                                               batched_draft, batch_policy, prefill_budget, solo)
            return self._batcher

    def submit(self, request: GenerateRequest | PreparedRequest, *, on_text: Callable[[str], None] | None = None,
               cancel: threading.Event | None = None) -> Handle[Generation]:
        """Queue a request into the running batch (started with the backend's slots if not yet): a Handle to iterate
        its text, cancel it, or wait for its Generation. QueueFull when max_batch + max_waiting are in flight.
        on_text runs on the batching thread; `cancel`, like handle.cancel(), stops the request before its next step."""
        from specpack.runtime.pack_batching import PackJob

        if on_text is not None and not callable(on_text):
            raise SpecpackError("invalid on_text", expected="a function taking a str, or None", found=brief(on_text))
        prepared = request if isinstance(request, PreparedRequest) else self.prepare(request)
        batcher = self._batcher or self.start_batching()
        handle: Handle[Generation] = Handle(on_text)
        batcher.submit(PackJob(prepared, handle, cancel))
        return handle

    def _check_open(self) -> None:
        if self.closed:
            raise SpecpackError(f"the pack {self.path} is closed", expected="generate before close()",
                                found="generate after close()", hint="load the pack again: specpack.load(PATH)")

    def __enter__(self) -> Pack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Wait for a running generation, then free the backend's sessions and buffers; later generate calls raise a
        SpecpackError. Closing again does nothing. Requests still in a batch (start_batching) end with a SpecpackError."""
        with self._batching_lock:
            batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher.close()
        with self.exclusive() as backend:
            if not self.closed:
                self.closed = True
                backend.close()

