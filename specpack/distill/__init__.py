"""`specpack distill`: train a draft head for a target by self-distillation (docs/heads.md).

    config.py       DistillConfig: every setting and its default, once
    seed_prompts.py the prompts the target writes its own training answers to (templates x topics; never eval sets)
    data.py         the data recipe: sources -> token ids + loss mask, each part's sha256
    subset.py       the frequency-ranked vocabulary subset the head drafts over
    checkpoint.py   HEAD/ckpt/latest.pt: weights, optimizer, step, losses (written atomically)
    trainer.py      the loop: the target online (features + soft labels), training-time test, progress, checkpoints

The head itself (model, file format, target hash) lives in specpack/heads/, which export/ reads too.
"""
