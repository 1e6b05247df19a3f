"""specpack: compiled speculative decoding. `specpack.load(PACK).generate(prompt)`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specpack.errors import SpecpackError  # light: the one error type every user-facing failure raises

__version__ = "0.1.0"

if TYPE_CHECKING:
    from specpack.runtime.pack import Generation, Pack, load


def __getattr__(name: str) -> Any:  # lazy: `import specpack` stays cheap, the CLI loads only what it uses
    if name in ("load", "Pack", "Generation"):
        from specpack.runtime import pack

        return getattr(pack, name)
    raise AttributeError(f"module 'specpack' has no attribute {name!r}")


__all__ = ["Generation", "Pack", "SpecpackError", "__version__", "load"]
