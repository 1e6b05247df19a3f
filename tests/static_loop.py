"""A speculative loop over a static-form pack's two graphs, for tests: StaticRunner sessions, nothing of runtime/.

The runtime's cpu backend picks its cache from the manifest (the static form lands there separately); this loop
is the contract of names.py and the acceptance rule's bookkeeping, written out once for the tensorrt-form tests:

    draft:   feed the ids it has not seen, then its own drafts one by one -> d_1..d_k, q [1, k, V]
    verify:  feed the ids the target has not seen + d_1..d_k -> n accepted, next token
    commit:  ids += d_1..d_n, next;  both caches roll back to len(ids) - 1 (the next token is fed next step)
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from specpack import names
from specpack.contract.manifest import Manifest, parse_manifest, read_manifest_bytes
from specpack.sampling import SamplingParams
from tests.static_harness import StaticRunner


class StaticPackLoop:
    """generate(prompt ids, max_new, k, params, seed, keep) -> new token ids (stops at an eos id, eos included)."""

    def __init__(self, pack_dir: Path) -> None:
        self.manifest: Manifest = parse_manifest(read_manifest_bytes(pack_dir))
        m = self.manifest
        self.vocab, self.eos = m.vocab_size, set(m.eos_token_ids)
        length = m.max_len + m.k_max + 1
        self.draft = StaticRunner(pack_dir / m.draft.graph.path, _info(m.draft), length)
        self.target = StaticRunner(pack_dir / m.target.graph.path, _info(m.target), length)

    def generate(self, prompt: list[int], max_new: int, k: int, params: SamplingParams, seed: int = 0,
                 keep: int | None = None) -> list[int]:
        """keep: return after the step that makes `keep` tokens (its first `keep` as they would be: a later step draws
        after them and changes none of them); the step sizes still follow max_new."""
        rng = np.random.Generator(np.random.Philox(seed))
        sampling = params.graph_inputs()
        self.draft.rollback(0)
        self.target.rollback(0)
        ids, out = list(prompt), list[int]()
        while len(out) < max_new:
            k_now = min(k, max_new - len(out) - 1)  # drafts past the limit would be thrown away
            drafts, q = self._propose(ids, k_now, sampling, rng)
            uniforms = rng.random((1, k_now + 1), dtype=np.float32)  # [1, k+1]
            result = self.target.run(np.array(ids[self.target.length:] + drafts, np.int64),
                                     **{names.DRAFT_PROBS: q, names.UNIFORMS: uniforms}, **sampling)
            n, nxt = int(result[names.N_ACCEPTED][0]), int(result[names.NEXT_TOKEN][0])
            for token in [*drafts[:n], nxt]:
                out.append(token)
                if token in self.eos or len(out) == max_new:
                    return out
            if keep is not None and len(out) >= keep:
                return out
            ids += [*drafts[:n], nxt]
            self.target.rollback(len(ids) - 1)
            self.draft.rollback(min(self.draft.length, len(ids) - 1))
        return out

    def _propose(self, ids: list[int], k: int, sampling: dict[str, np.ndarray], rng: np.random.Generator
                 ) -> tuple[list[int], np.ndarray]:
        drafts, q = list[int](), np.zeros((1, k, self.vocab), np.float32)  # [1, k, V]
        for i in range(k):
            feed = np.array([*ids, *drafts][self.draft.length:], np.int64)
            result = self.draft.run(feed, **{names.UNIFORM: rng.random(1, dtype=np.float32)}, **sampling)
            drafts.append(int(result[names.TOKEN][0]))
            q[0, i] = result[names.PROBS][0]
        return drafts, q


def _info(entry: object) -> SimpleNamespace:
    return SimpleNamespace(num_layers=entry.num_layers, kv_heads=entry.kv_heads,  # type: ignore[attr-defined]
                           head_dim=entry.head_dim)  # type: ignore[attr-defined]
