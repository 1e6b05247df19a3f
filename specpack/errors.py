"""One error type for everything a user can get wrong: it says what was expected, what was found, what to do."""

from __future__ import annotations


class SpecpackError(Exception):
    """A user-facing error. The CLI prints it without a traceback and exits with status 2."""

    def __init__(self, what: str, *, expected: str | None = None, found: str | None = None, hint: str | None = None):
        self.what, self.expected, self.found, self.hint = what, expected, found, hint
        lines = [what]
        if expected is not None:
            lines.append(f"  expected: {expected}")
        if found is not None:
            lines.append(f"  found:    {found}")
        if hint is not None:
            lines.append(f"  hint:     {hint}")
        super().__init__("\n".join(lines))
