"""Export settings: one frozen dataclass, its defaults in one place; the CLI reads them from here."""

from __future__ import annotations

from dataclasses import dataclass

from specpack.errors import SpecpackError
from specpack.limits import DEFAULT_K, DEFAULT_MAX_LEN, DTYPES, K_MAX, K_MIN, check_export_k

__all__ = ["DEFAULT_K", "DEFAULT_MAX_LEN", "DTYPES", "K_MAX", "K_MIN", "ExportConfig"]  # the CLI reads them here


@dataclass(frozen=True)
class ExportConfig:
    k: int = DEFAULT_K                # the pack's k_max: drafts per step, at most
    max_len: int | None = None        # prompt + generated tokens; None: min(2048, both position limits)
    dtype: str = "fp32"
    overwrite: bool = False           # replace an existing pack at the output path
    isolate: bool = True              # export each model in its own process (peak memory of the 1.5B: ~11 GB)

    def __post_init__(self) -> None:
        check_export_k(self.k)
        if self.max_len is not None and (not isinstance(self.max_len, int) or self.max_len < 2):
            raise SpecpackError("invalid --max-len", expected="an integer >= 2", found=repr(self.max_len))
        if self.dtype not in DTYPES:
            raise SpecpackError("invalid --dtype", expected=" or ".join(DTYPES), found=repr(self.dtype))

    def resolve_max_len(self, *limits: int | None) -> int:
        """--max-len, or its default: the smaller of 2048 and the models' position limits; larger is refused."""
        known = [n for n in limits if n is not None]
        ceiling = min([DEFAULT_MAX_LEN, *known]) if self.max_len is None else min(known, default=self.max_len)
        if self.max_len is None:
            return ceiling
        if self.max_len > ceiling:
            raise SpecpackError("--max-len is larger than the models' position limit",
                                expected=f"--max-len <= {ceiling} (draft/target position limits {limits})",
                                found=str(self.max_len))
        return self.max_len
