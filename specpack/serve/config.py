"""The server's settings: one frozen dataclass, its defaults in one place (the CLI reads them from here)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from specpack.errors import SpecpackError
from specpack.limits import DRAFTERS, TREE_AUTO, TreeOption, check_k, check_tree
from specpack.runtime.ngram_drafter import NgramConfig

MAX_READ_TIMEOUT_S = 3600.0  # a longer one would let slow clients hold connections for hours
MAX_CONNECTIONS = 1 << 16
MAX_BATCH = 256  # one KV cache per row is allocated at load


@dataclass(frozen=True)
class ServeConfig:
    pack: Path
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "cpu"              # a registered backend (specpack.runtime.backend.BACKENDS)
    k: int | None = None             # drafts per step, 0..k_max; None: adaptive ("auto", as Pack.generate's k=None)
    tree: TreeOption = TREE_AUTO     # "auto" | "off" | N nodes (as Pack.generate's tree); a request may pick
    drafter: str | None = None       # "model" | "ngram"; None: the pack's own (as Pack.generate); a request may pick
    ngram: NgramConfig = field(default_factory=NgramConfig)  # the n-gram drafter's n range (--ngram-min/--ngram-max)
    max_queue: int = 32              # requests waiting for the decoder (besides those decoding); more get 429
    max_batch: int = 1               # requests decoded at once (the runtime's scheduler: docs/batching.md); 1: alone
    timeout_s: float = 600.0         # a request still unanswered after this long is cancelled (504)
    shutdown_grace_s: float = 30.0   # on SIGTERM, in-flight requests get this long to finish, then are cancelled
    model_name: str | None = None    # the `model` clients send; None: the pack directory's name
    max_body_bytes: int = 1 << 20    # a longer request body is refused (413) before it is parsed or tokenized
    read_timeout_s: float = 30.0     # a request's head, and then its body, must arrive within this long (408)
    max_connections: int = 256       # open connections; more are answered 503 and closed (the fd budget: descriptors.py)
    manifest_sha256: str | None = None  # the pin: specpack.load refuses any other manifest (docs/security.md)
    threads: int | None = None       # intra-op threads per session; None: the runtime's (the CPUs this process may use)

    def __post_init__(self) -> None:
        if self.k is not None:
            check_k(self.k, what="--k")  # against the pack's k_max once it is loaded (server.load_pack)
        try:
            object.__setattr__(self, "tree", check_tree(self.tree))  # against the pack's once it is loaded
        except SpecpackError as err:
            raise SpecpackError("invalid --tree", expected=err.expected, found=err.found, hint=err.hint) from None
        if self.drafter is not None and self.drafter not in DRAFTERS:  # whether the pack has it: server.load_pack
            raise SpecpackError("invalid --drafter", expected=" | ".join(DRAFTERS), found=repr(self.drafter))
        if not 1 <= self.max_batch <= MAX_BATCH:
            raise SpecpackError("invalid --max-batch", expected=f"an integer in 1..{MAX_BATCH}", found=str(self.max_batch))
        if self.max_queue < 0:
            raise SpecpackError("invalid --max-queue", expected="an integer >= 0", found=str(self.max_queue))
        if not 0 < self.timeout_s < math.inf:
            raise SpecpackError("invalid --timeout", expected="seconds > 0, finite", found=str(self.timeout_s))
        if not 0 <= self.shutdown_grace_s < math.inf:
            raise SpecpackError("invalid --shutdown-grace", expected="seconds >= 0, finite",
                                found=str(self.shutdown_grace_s))
        if self.max_body_bytes < 1:
            raise SpecpackError("invalid --max-body-bytes", expected="an integer >= 1", found=str(self.max_body_bytes))
        if not 0 < self.read_timeout_s <= MAX_READ_TIMEOUT_S:
            raise SpecpackError("invalid --read-timeout", expected=f"seconds in (0, {MAX_READ_TIMEOUT_S:g}]",
                                found=str(self.read_timeout_s))
        if not 1 <= self.max_connections <= MAX_CONNECTIONS:
            raise SpecpackError("invalid --max-connections", expected=f"an integer in 1..{MAX_CONNECTIONS}",
                                found=str(self.max_connections))
        if self.threads is not None and self.threads < 1:
            raise SpecpackError("invalid threads", expected="an integer >= 1, or None", found=str(self.threads))
        if not 0 <= self.port < 65536:
            raise SpecpackError("invalid --port", expected="0..65535", found=str(self.port))

    @property
    def served_name(self) -> str:
        return self.model_name or Path(self.pack).resolve().name
