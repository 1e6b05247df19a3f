"""What tiny draft heads are trained on, and with which settings (the tiny_head fixture, tests/distill)."""

from __future__ import annotations

from pathlib import Path

HEAD_TEXT_LINES = 400  # the tiny heads' training text (tiny_head_corpus)


def tiny_head_corpus(path: Path) -> Path:
    """A fixed text of words the tiny tokenizers know, seeded: what tiny heads are trained on."""
    import random

    rng = random.Random(0)
    words = ["def", "class", "return", "import", "for", "while", "if", "else", "print", "range", "list", "dict",
             "self", "value", "key", "name", "data", "file"]
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(HEAD_TEXT_LINES)),
                    encoding="utf-8")
    return path


TINY_HEAD_SETTINGS = {"seq_len": 32, "batch": 4, "subset_size": 200, "lr": 3e-3, "log_every": 10, "threads": 1,
                      "progress": False}
