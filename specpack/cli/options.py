"""Options that several commands share, each defined once: `--k` (run time), `--tree`, `--drafter`,
`--ngram-min/--ngram-max/--ngram-width`.

    @k_option @tree_option @drafter_option @ngram_options   -> k_text: str, tree_text: str, drafter: str | None,
                                                               ngram_min, ngram_max, ngram_width: int
    parse_k(k_text) -> int | None (None: auto);  parse_tree(tree_text) -> "auto" | "off" | int (limits.py)
    ngram_config(ngram_min, ngram_max, ngram_width) -> NgramConfig (checked there)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from specpack.limits import DRAFTERS, K_AUTO, TREE_AUTO
from specpack.runtime.ngram_drafter import NgramConfig

F = TypeVar("F", bound=Callable[..., Any])
NGRAM = NgramConfig()  # the n-gram drafter's defaults, defined there once

k_option = click.option(
    "--k", "k_text", default=K_AUTO, show_default=True,
    help="Drafts per step: auto (chosen per step from acceptance and measured step costs), or a fixed 0..the pack's "
         "k_max (0: the target alone).")

tree_option = click.option(
    "--tree", "tree_text", default=TREE_AUTO, show_default=True,
    help="Token trees (a pack exported with --max-tree-nodes; the n-gram drafter, or the pack's head): auto (nodes, "
         "width and depth chosen per step from acceptance and measured verify costs), off (chains), or N nodes every "
         "step (1..the pack's max tree nodes). docs/trees.md.")

drafter_option = click.option(
    "--drafter", type=click.Choice(DRAFTERS), default=None,
    help="Who drafts: the pack's draft model, prompt lookup (n-gram, no model), or the pack's draft head. Default: the "
         "pack's own.")


def ngram_options(fn: F) -> F:
    """--ngram-min and --ngram-max, the n-gram drafter's range (NgramConfig's defaults)."""
    fn = click.option("--ngram-min", type=int, default=NGRAM.n_min, show_default=True,
                      help="n-gram drafter: the shortest context suffix looked up.")(fn)
    fn = click.option("--ngram-max", type=int, default=NGRAM.n_max, show_default=True,
                      help="n-gram drafter: the longest context suffix looked up (tried first).")(fn)
    return click.option("--ngram-width", type=int, default=NGRAM.width, show_default=True,
                        help="n-gram drafter: the most earlier occurrences merged into a token tree (its widest node) "
                             "where --tree is not off and the pack verifies trees (docs/trees.md). 1: chains.")(fn)


def ngram_config(ngram_min: int, ngram_max: int, ngram_width: int = NGRAM.width) -> NgramConfig:
    return NgramConfig(ngram_min, ngram_max, ngram_width)
