"""The speculative decoding loop (DESIGN.md). Allocates nothing per step: tokens live in buffers.ids.

State between steps: ids[:, :n_ctx] are committed; the target caches the first n_ctx - 1 of them (the
last committed token is fed again with the drafts); the draft caches some prefix (it catches up by
feeding S > 1 tokens when it is behind, e.g. after all k drafts and the bonus token were accepted).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from specpack.runtime.buffers import DecodeBuffers
from specpack.runtime.engine import DraftEngine, TargetEngine
from specpack.runtime.stats import DecodeStats

OnTokens = Callable[[list[int]], None]


def generate_tokens(draft: DraftEngine, target: TargetEngine, buffers: DecodeBuffers,
                    prompt: Sequence[int], max_new_tokens: int, k: int, eos_ids: frozenset[int],
                    rng: np.random.Generator | None, on_tokens: OnTokens | None = None) -> tuple[list[int], DecodeStats]:
    """Generate up to max_new_tokens after `prompt` (k = 0: the target alone, autoregressive).

    rng is None for greedy decoding (the graphs ignore the uniforms). Returns the new tokens, ending
    with the eos id when one ended generation, and the statistics.
    """
    stats = DecodeStats(k=k)
    ids = buffers.ids[0]  # [max_len + k_max + 1]
    n_ctx = len(prompt)
    ids[:n_ctx] = prompt
    target.rollback(0)
    draft.rollback(0)
    out: list[int] = []
    t0 = time.perf_counter()

    # 1. Prefill: the target over the prompt with no drafts gives the first token.
    if rng is not None:
        buffers.draw_uniforms(rng, 0)
    _, token = target.verify(end=n_ctx, k=0)
    ids[n_ctx] = token
    done = _emit([token], out, eos_ids, max_new_tokens, on_tokens)
    if k > 0 and not done:
        draft.propose(end=n_ctx, slot=0)  # the draft's prefill belongs to the first token's time too
    n_ctx += 1
    t_first = time.perf_counter()
    stats.ttft_s = t_first - t0

    while not done:
        # 2. Draft: k' tokens, k' capped so the verify never emits past max_new_tokens, nor drafts past an eos.
        k_step = min(k, max_new_tokens - len(out) - 1)
        if rng is not None:
            buffers.draw_uniforms(rng, k_step)
        for i in range(k_step):
            ids[n_ctx + i] = draft.propose(end=n_ctx + i, slot=i)
            if ids[n_ctx + i] in eos_ids:  # nothing after an eos is ever emitted: stop drafting there
                k_step = i + 1
                break
        # 3. Verify the last committed token and the drafts in one target pass.
        n_accepted, token = target.verify(end=n_ctx + k_step, k=k_step)
        stats.record_step(k_step, n_accepted)
        # 4. Commit the accepted drafts (already in place) and the next token; roll both caches back.
        ids[n_ctx + n_accepted] = token
        target.rollback(n_ctx + n_accepted)
        draft.rollback(min(draft.kv_length, n_ctx + n_accepted))
        new = ids[n_ctx : n_ctx + n_accepted + 1].tolist()
        n_ctx += n_accepted + 1
        done = _emit(new, out, eos_ids, max_new_tokens, on_tokens)

    stats.decode_s = time.perf_counter() - t_first
    stats.new_tokens = len(out)
    return out, stats


def _emit(new: list[int], out: list[int], eos_ids: frozenset[int], max_new_tokens: int,
          on_tokens: OnTokens | None) -> bool:
    """Append new tokens up to the first eos (inclusive) or the budget; True when generation is over."""
    for i, token in enumerate(new):
        if token in eos_ids or len(out) + i + 1 >= max_new_tokens:
            new = new[: i + 1]
            break
    out.extend(new)
    if on_tokens is not None:
        on_tokens(new)
    return len(out) >= max_new_tokens or (bool(new) and new[-1] in eos_ids)
