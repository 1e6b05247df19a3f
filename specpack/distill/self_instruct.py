"""Requests the target writes for itself (the default recipe's `self-instruct` source, before it answers them).

The seed templates (seed_prompts.py) are 24 sentences with a word swapped in: their answers are narrow, and a head
trained on them drafts the target's prose poorly (MT-bench's position-1 acceptance 0.38-0.46 against 0.53-0.61 on
HumanEval, bench/README.md). Here the target itself, sampled at REQUEST_TEMPERATURE, writes one message a user might
send to an assistant from a meta-prompt (a kind of request x a subject, drawn with a seeded Philox), so the requests
are as varied as the target can make them; data._answered then has it answer each one (half greedy, half sampled).
Everything the head trains on is the target's own text. Written for specpack from nothing but the words below: no
evaluation set (Spec-Bench, MT-bench, HumanEval, GSM8K, ShareGPT) is read, and tests/distill checks that no 8 words
in a row of these templates occur in the prompt sets under ../shared/data/prompts.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np

from specpack.distill.seed_prompts import WORDS, topics

REQUEST_TEMPERATURE = 1.0
REQUEST_TOKENS = 160  # a request longer than this is cut (still a usable prompt)
META = ("Write one realistic message that a person might send to an AI assistant. It should be {kind}, and it "
        "should involve {subject}. Reply with that message only, with no title, quotes or explanation.")
KINDS = (
    "a creative writing request (a story, a poem, a speech or a letter)",
    "a role-play request in which the assistant acts as a character or a professional",
    "a logic or reasoning puzzle with a definite answer",
    "a math word problem that takes a few steps to solve",
    "a programming task in Python, JavaScript, C++, Rust, Go or SQL",
    "a request to pull specific facts out of a short passage that the message itself contains",
    "a question about physics, chemistry, biology, medicine or engineering",
    "a question about history, philosophy, economics, law or the arts",
    "a request for practical advice about health, travel, money, studying or work",
    "a request to rewrite, shorten or improve a paragraph that the message itself contains",
    "a request to summarize a passage that the message itself contains",
    "a request to translate a few sentences between two languages",
    "a request to compare two options and recommend one",
    "a request to explain an idea to a complete beginner",
    "a request to draft a professional email, report or announcement",
    "a request to plan an event, a trip or a project step by step",
    "a request to review or debug a short piece of code that the message itself contains",
    "a question asking for an opinion with arguments on both sides",
)
SUBJECTS = (*WORDS, "a small business", "a school project", "climate", "a new smartphone", "ancient Rome",
            "the stock market", "a job interview", "a chess opening", "a recipe", "a hospital", "a spacecraft",
            "a football team", "a novel", "a wedding", "an election", "a vaccine", "a mountain village", "a startup",
            "a neural network", "a database", "a web server", "a birthday party", "a dog", "a museum tour",
            "quantum computing", "a rainforest", "electric cars", "a court case", "a film review", "a language exam",
            "a marathon", "a budget spreadsheet", "a medieval castle", "the ocean", "a jazz band", "a farm",
            "a city council", "a bridge", "a vacation", "a kitchen renovation", "a coffee shop", "a pandemic",
            "a mobile game", "winter", "an airport", "the Moon", "a detective", "a customer complaint")


def meta_prompts(count: int, seed: int) -> list[str]:
    """`count` meta-prompts: a kind and a subject (or, one time in four, a Python module) drawn with Philox(seed)."""
    rng = np.random.Generator(np.random.Philox([seed, 1]))  # a stream apart from seed_prompts'
    modules = topics()
    out = []
    for _ in range(count):
        kind = KINDS[int(rng.integers(len(KINDS)))]
        if rng.random() < 0.25:
            subject = f"the Python {modules[int(rng.integers(len(modules)))]} module"
        else:
            subject = SUBJECTS[int(rng.integers(len(SUBJECTS)))]
        out.append(META.format(kind=kind, subject=subject))
    return out


def templates_sha256() -> str:
    """sha256 of the meta-prompt, the kinds and the subjects, recorded with every head trained on them."""
    return hashlib.sha256("\n".join((META, *KINDS, *SUBJECTS)).encode()).hexdigest()


def write_requests(count: int, seed: int, model: Any, tokenizer: Any, batch: int, eos: int) -> list[str]:
    """The target's own requests: one sampled answer to each meta-prompt, decoded and stripped (empty ones dropped)."""
    import torch

    from specpack.distill.data import encode_prompt, generate, log_progress

    prompts = [encode_prompt(tokenizer, text, True) for text in meta_prompts(count, seed)]
    requests: list[str] = []
    began = time.monotonic()
    for start in range(0, len(prompts), batch):
        torch.manual_seed(seed * 1_000_003 + start + 7)
        for ids in generate(model, prompts[start:start + batch], REQUEST_TOKENS, REQUEST_TEMPERATURE, eos):
            text = str(tokenizer.decode(ids, skip_special_tokens=True)).strip().strip('"').strip()
            if text:
                requests.append(text)
        log_progress(f"self-instruct: {min(start + batch, count)} of {count} requests written", began)
    return requests
