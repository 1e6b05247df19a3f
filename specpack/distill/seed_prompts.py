"""The prompts the target answers for its own training data: fixed templates x topics, chosen with a seed.

Written for specpack, from nothing but the words below and the names of Python's standard library modules: no
evaluation set (Spec-Bench, MT-bench, HumanEval, GSM8K, ShareGPT) is read, and tests/distill checks that no 8 words
in a row of these templates occur in the prompt sets under ../shared/data/prompts.
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np

TEMPLATES = (
    "Write a Python function that uses the {topic} module, with a docstring and a short usage example.",
    "Explain what the Python {topic} module is for, and show two typical uses in code.",
    "Write a small command-line tool in Python built around {topic}, and explain each part of it.",
    "Summarize, in five bullet points, what a programmer should know about {word} before using it.",
    "Translate this sentence into French, then explain the grammar: the {word} is on the table near the window.",
    "Write a short story of about two hundred words about a {word} that learns to speak.",
    "Invent an arithmetic word problem about {word}s with three steps, then solve it step by step.",
    "Write unit tests with pytest for a function that parses {topic} style configuration strings.",
    "Compare two ways of doing {topic}-related work in Python and say when each one is the better choice.",
    "Write a letter to a friend describing a day spent looking for a lost {word}.",
    "Refactor this idea into clean Python: a class that caches the results of {topic} calls with a size limit.",
    "Give a step by step plan for learning about {word}, with one exercise per step.",
    "Pretend you are a tour guide in a town famous for its {word}. Greet a group of visitors and show them around.",
    "A shop sells {word}s for 7 dollars each and gives one free for every four bought. How much do 13 cost? Reason "
    "it out carefully.",
    "From this note, pull out every name, date and amount as JSON: 'On 3 May, Ana paid 40 euros for a {word}; on 9 "
    "May, Tom paid 25.'",
    "Explain to a curious teenager the physics behind a {word}, using one everyday comparison.",
    "Describe how the history of the {word} changed daily life, in three short paragraphs.",
    "Summarize the main trade-offs of the Python {topic} module for a code review, in under one hundred words.",
    "Answer briefly, then justify: is a {word} more like a tool or more like a place? Give two arguments each way.",
    "Write a haiku and then a limerick about a {word}, and explain which form suits the subject better.",
    "Debug this plan: someone wants to store every {word} record in one global Python list shared by threads. What "
    "goes wrong, and what should they do instead?",
    "Write a SQL schema and two example queries for an app that tracks {word}s and their owners.",
    "Rewrite this sentence in a formal tone and then in a playful tone: the {word} broke again this morning.",
    "List five questions an interviewer might ask about the Python {topic} module, with a model answer to each.",
)
WORDS = ("lighthouse", "bicycle", "garden", "violin", "river", "robot", "market", "library", "kite", "glacier",
         "bakery", "compass", "telescope", "harbor", "orchard", "festival", "volcano", "lantern", "meadow", "train")


def topics() -> list[str]:
    """Python standard library module names (public, sorted): what this interpreter ships."""
    names = sorted(getattr(sys, "stdlib_module_names", ()))
    return [n for n in names if not n.startswith("_")] or ["os", "re", "json", "pathlib", "itertools"]


def seed_prompts(count: int, seed: int) -> list[str]:
    """`count` prompts: template, topic and word drawn with numpy's Philox seeded by `seed`."""
    rng = np.random.Generator(np.random.Philox(seed))
    mods = topics()
    out = []
    for _ in range(count):
        template = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
        out.append(template.format(topic=mods[int(rng.integers(len(mods)))], word=WORDS[int(rng.integers(len(WORDS)))]))
    return out


def templates_sha256() -> str:
    """sha256 of the templates and word list, recorded with every head trained on them."""
    return hashlib.sha256("\n".join((*TEMPLATES, *WORDS)).encode()).hexdigest()
