"""One generate request: typed, frozen, its defaults written here once, checked once (docs/architecture.md, "Requests").

    GenerateRequest(prompt, max_new_tokens=MAX_NEW_TOKENS, k=None, drafter=None, sampling=SamplingParams(),
                    seed=None, chat=False, stop=(), tree="auto", limits=None)
                    checked as it is made; `limits` (a loaded pack's PackLimits) bound k, max_new_tokens and the ids by
                    that pack, and the error says so ("0..8 (this pack's k_max)"); None: by any pack's
    GenerateRequest.of(prompt, max_new_tokens, k=..., temperature=..., top_k=..., top_p=..., ..., limits=None)
                    the same from loose values (numpy integers, an id array, numbers for the sampling transform):
                    what the CLI, the server, bench and Pack.generate build
    Pack.prepare(request) -> PreparedRequest    the request against the pack: its limits (unless the request was made
                    with them), the drafter it has, the prompt encoded, prompt + max_new_tokens <= max_len
    Pack.run(prepared, on_text=..., cancel=...) -> Generation

Every value is checked once: Pack.generate, the server and bench make the request with the pack's limits; the CLI makes
it before it loads the pack (a bad argument is refused without loading anything), and Pack.prepare then checks only what
the pack's limits add. The server prepares a request before it is queued (every refusal is a 400 before decoding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field

from specpack.errors import SpecpackError
from specpack.limits import DRAFTERS, K_MAX, TREE_AUTO, TreeOption, check_k, check_tree
from specpack.sampling import SamplingParams
from specpack.validation import PackLimits, brief, check_ids, check_integer, check_number, check_prompt, is_bool

MAX_NEW_TOKENS = 128            # a request's default number of new tokens (generate --max-new-tokens, bench)
MAX_NEW_TOKENS_LIMIT = 1 << 31  # the most any request asks for before a pack is known (then: the pack's max_len)
SEED_LIMIT = 1 << 64            # seeds are 0 .. 2**64 - 1
TOP_K_MAX = (1 << 31) - 1       # top_k is an int64 graph input; anything past the vocabulary keeps every token
GREEDY = SamplingParams()       # the default sampling transform (SamplingParams' defaults: temperature 0, greedy)


class DrafterError(SpecpackError):
    """A drafter that does not exist, or that the pack lacks (the server names the `drafter` field for it)."""


@dataclass(frozen=True)
class GenerateRequest:
    """What one generate call asks for. Made from typed values (or by `of` from loose ones) and checked as it is made:
    a GenerateRequest that exists is valid for the pack whose limits it was made with (`checked_for`), or else for some
    pack (its ids' range included: Pack.prepare checks them against the pack's vocabulary)."""

    prompt: str | tuple[int, ...]        # text, or token ids (any 1-D integer sequence; their range: Pack.prepare)
    max_new_tokens: int = MAX_NEW_TOKENS
    k: int | None = None                 # drafts per step, 0..k_max (0: the target alone); None: adaptive ("auto")
    drafter: str | None = None           # "model" | "ngram"; None: the pack's own (its manifest's `drafter`)
    sampling: SamplingParams = GREEDY    # the sampling transform (greedy by default)
    seed: int | None = None              # the uniforms' seed (sampling only); None: a fresh random one
    chat: bool = False                   # wrap a text prompt as one user message in the model's chat template
    stop: tuple[str, ...] = field(default=())  # generation ends right before the first of these in the text
    tree: TreeOption = TREE_AUTO         # "auto": token trees where the pack and drafter verify them, sized per step
                                         # (tree_policy.py); "off": chains; N: N nodes every step (docs/trees.md)
    limits: InitVar[PackLimits | None] = None  # the pack's limits to check against (None: any pack's)
    checked_for: PackLimits | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self, limits: PackLimits | None) -> None:
        if not is_bool(self.chat):
            raise SpecpackError("invalid chat", expected="True or False", found=brief(self.chat))
        if not isinstance(self.sampling, SamplingParams):
            raise SpecpackError("invalid sampling", expected="a SamplingParams(temperature, top_k, top_p)",
                                found=brief(self.sampling))
        prompt = check_prompt(self.prompt, chat=bool(self.chat), vocab_size=None if limits is None else limits.vocab_size)
        max_len = limits.max_len if limits is not None else None
        checked = {
            "prompt": prompt if isinstance(prompt, str) else tuple(prompt),
            "chat": bool(self.chat),
            "max_new_tokens": check_integer(self.max_new_tokens, "max_new_tokens", 1, max_len or MAX_NEW_TOKENS_LIMIT,
                                            "at most the pack's max_len" if max_len else ""),
            "k": None if self.k is None else check_k(self.k, K_MAX if limits is None else min(K_MAX, limits.k_max)),
            "seed": None if self.seed is None else check_integer(self.seed, "seed", 0, SEED_LIMIT - 1),
            "stop": _check_stop(self.stop),
            "tree": check_tree(self.tree, None if limits is None else limits.max_nodes),
            "checked_for": limits,
        }
        if isinstance(checked["tree"], int) and checked["k"] is not None:
            raise SpecpackError("k and a fixed tree both fix a step's drafts", expected="one of them: k (a chain of k "
                                "drafts) or tree N (a tree of N nodes)", found=f"k {checked['k']}, tree {checked['tree']}",
                                hint="leave k at auto with a fixed tree")
        if self.drafter is not None and self.drafter not in DRAFTERS:
            raise DrafterError(f"unknown drafter {self.drafter!r}", expected=" | ".join(DRAFTERS),
                               found=repr(self.drafter))
        for name, value in checked.items():  # Python values in place of numpy ones, a tuple in place of a list
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, prompt: object, max_new_tokens: object = MAX_NEW_TOKENS, *, k: object = None,
           drafter: str | None = None, temperature: object = GREEDY.temperature, top_k: object = GREEDY.top_k,
           top_p: object = GREEDY.top_p, seed: object = None, chat: object = False,
           stop: Sequence[str] = (), tree: object = TREE_AUTO, limits: PackLimits | None = None) -> GenerateRequest:
        """A request from loose values: Python or numpy numbers, ids as a list, tuple or integer array."""
        sampling = SamplingParams(check_number(temperature, "temperature"),
                                  check_integer(top_k, "top_k", 0, TOP_K_MAX, "0 disables"), check_number(top_p, "top_p"))
        return cls(prompt, max_new_tokens, k, drafter, sampling, seed, chat, tuple(stop),  # type: ignore[arg-type]
                   tree, limits)  # type: ignore[arg-type]

    def check_fits(self, limits: PackLimits) -> None:
        """What a pack's limits add (Pack.prepare, for a request not made with them): prompt ids in [0, vocab_size),
        max_new_tokens at most its max_len, k at most its k_max, a fixed tree at most its max tree nodes."""
        if self.checked_for == limits:
            return
        if not isinstance(self.prompt, str):
            check_ids(self.prompt, limits.vocab_size)
        check_integer(self.max_new_tokens, "max_new_tokens", 1, limits.max_len, "at most the pack's max_len")
        if self.k is not None:
            check_k(self.k, min(K_MAX, limits.k_max))
        check_tree(self.tree, limits.max_nodes)


@dataclass(frozen=True)
class PreparedRequest:
    """A request checked against one pack (made by Pack.prepare only): what Pack.run decodes."""

    request: GenerateRequest
    ids: tuple[int, ...]   # the prompt's token ids (a text prompt encoded, in the chat template with chat=True)
    drafter: str           # the drafter that runs: the request's, else the pack's own


def _check_stop(stop: object) -> tuple[str, ...]:
    if isinstance(stop, str) or not isinstance(stop, Sequence):
        raise SpecpackError("invalid stop", expected="a sequence of stop strings", found=brief(stop))
    bad = [s for s in stop if not isinstance(s, str) or not s]
    if bad:
        raise SpecpackError("invalid stop string", expected="non-empty strings", found=repr(bad[0]))
    return tuple(stop)
