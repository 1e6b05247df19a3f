"""specpack distill on the tiny targets (CPU, one torch thread): the loss falls, a seed fixes the result, a stopped
run resumes to the very weights of one that never stopped, and the record says what the head was trained on."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from specpack.cli.main import cli
from specpack.distill import self_instruct
from specpack.distill.config import DistillConfig
from specpack.distill.data import Corpus, ids_sha256
from specpack.distill.seed_prompts import TEMPLATES, WORDS
from specpack.distill.trainer import distill
from specpack.errors import SpecpackError
from specpack.heads.target_hash import target_weights_sha256
from tests.tiny_heads import TINY_HEAD_SETTINGS, tiny_head_corpus

SHARED_PROMPTS = Path(__file__).resolve().parents[3] / "shared" / "data" / "prompts"


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)  # the trainer sets it too; the tests' own torch work follows


def _config(tmp: Path, **overrides: object) -> DistillConfig:
    data = tmp / "corpus.txt"
    if not data.exists():
        tiny_head_corpus(data)
    return DistillConfig(**{**TINY_HEAD_SETTINGS, "data": (str(data),), **overrides})  # type: ignore[arg-type]


def test_loss_falls(tiny_head: Callable[..., tuple[Path, Path]]) -> None:
    """120 steps: the loss-curve's last points (means over 10 steps) are well under its first ones, per TTT step."""
    head, _ = tiny_head()
    losses = json.loads((head / "head.json").read_text())["losses"]
    assert [p["step"] for p in losses] == list(range(10, 121, 10))
    first, last = np.mean([p["loss"] for p in losses[:2]]), np.mean([p["loss"] for p in losses[-2:]])
    assert last < 0.8 * first, (first, last)
    for i in range(5):  # every training-time-test step learns, the head fed its own outputs included
        assert np.mean([p["per_step"][i] for p in losses[-2:]]) < np.mean([p["per_step"][i] for p in losses[:2]])


def test_seeded_and_resumed_runs_give_the_same_head(tiny_pairs: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    """Same seed: the same weights bit for bit, whether the run stopped at step 12 and resumed or not; another seed
    gives other weights."""
    target = str(tiny_pairs("qwen2")[1])
    straight = distill(target, tmp_path / "straight", _config(tmp_path, steps=24, checkpoint_every=5))
    stopped = distill(target, tmp_path / "resumed", _config(tmp_path, steps=24, checkpoint_every=5, stop_at=12))
    assert not (stopped / "head.json").exists() and (stopped / "ckpt" / "latest.pt").is_file()
    assert torch.load(stopped / "ckpt" / "latest.pt", weights_only=False)["step"] == 12
    resumed = distill(target, tmp_path / "resumed", _config(tmp_path, steps=24, checkpoint_every=5))
    other = distill(target, tmp_path / "other", _config(tmp_path, steps=24, seed=1))

    a, b, c = (load_file(str(d / "head.safetensors")) for d in (straight, resumed, other))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a if k != "subset")
    ra, rb = (json.loads((d / "head.json").read_text()) for d in (straight, resumed))
    assert ra["losses"] == rb["losses"] and ra["weights_sha256"] == rb["weights_sha256"]


def test_resume_refuses_other_settings(tiny_pairs: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    target = str(tiny_pairs("qwen2")[1])
    distill(target, tmp_path / "h", _config(tmp_path, steps=4, stop_at=2))
    with pytest.raises(SpecpackError, match="other settings") as err:
        distill(target, tmp_path / "h", _config(tmp_path, steps=4, seq_len=16))
    assert "seq_len" in str(err.value)


def test_record(tiny_head: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    """head.json: the target's weight hash, the data's sha256 (of the token ids trained on), recipe, seed, curve."""
    head, target_dir = tiny_head()
    record = json.loads((head / "head.json").read_text())
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    assert record["target"]["weights_sha256"] == target_weights_sha256(target)
    tok = AutoTokenizer.from_pretrained(target_dir)
    text = tiny_head_corpus(tmp_path / "corpus.txt").read_text(encoding="utf-8")  # the same text, written again
    ids = np.asarray([*tok.encode(text, add_special_tokens=False), tok.eos_token_id], np.int32)
    assert record["data"] == [{"name": "text:corpus.txt", "tokens": ids.size, "loss_tokens": ids.size,
                               "sha256": ids_sha256(ids), "file": record["data"][0]["file"]}]
    assert record["training"]["seed"] == 0 and record["training"]["steps_done"] == 120
    assert record["recipe"]["sources"] == record["recipe"]["sources"][:1] and record["config"]["subset_size"] == 200
    subset = load_file(str(head / "head.safetensors"))["subset"]
    assert subset.shape == (200,) and torch.equal(subset, subset.sort().values)
    heldout = record["heldout"][-1]  # evaluated at the end on windows never trained on
    assert heldout["step"] == 120 and heldout["windows"] > 0
    assert len(heldout["top1"]) == len(heldout["loss"]) == record["training"]["ttt_steps"]
    assert all(0 <= v <= 1 for v in heldout["top1"]) and heldout["top1"][0] > 0


def test_held_out_windows_are_never_trained_on() -> None:
    from specpack.distill.trainer import HOLDOUT_EVERY, _batch, _split

    windows = np.arange(0, 32 * 500, 32)
    train, held = _split(windows)
    assert held.size == 500 // HOLDOUT_EVERY and not set(held) & set(train) and train.size + held.size == windows.size
    corpus = Corpus(np.arange(32 * 501, dtype=np.int32), np.ones(32 * 501, np.uint8), [])  # ids = offsets
    config = DistillConfig(**{**TINY_HEAD_SETTINGS, "data": ("x",)})  # type: ignore[arg-type]
    drawn = {int(s) for step in range(400) for s in _batch(corpus, train, config, step)[0][:, 0]}  # window starts
    assert drawn <= set(train.tolist()) and len(drawn) > train.size // 2
    assert _split(windows[: 2 * HOLDOUT_EVERY - 1])[1].size == 0  # a tiny corpus: no held-out windows


def test_the_evaluated_held_out_windows_span_the_corpus() -> None:
    """Not the first EVAL_WINDOWS held-out windows (all in the corpus's first parts: Run H's were mostly stdlib text)
    but windows spread from the first to the last, each once."""
    from specpack.distill.trainer import EVAL_WINDOWS, eval_windows

    heldout = np.arange(49, 50 * 1000, 50)  # 1,000 held-out windows' starts
    chosen = eval_windows(heldout)
    assert chosen.size == EVAL_WINDOWS and chosen[0] == heldout[0] and chosen[-1] == heldout[-1]
    assert np.all(np.diff(chosen) > 0) and set(chosen) <= set(heldout)
    assert np.array_equal(eval_windows(heldout[:10]), heldout[:10])


def test_cli_with_prompt_data(tiny_pairs: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    """`specpack distill --data PROMPTS --data TEXT`: the target answers the prompts; both parts are recorded."""
    target = tiny_pairs("qwen2")[1]
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "category": "mine", "turns": [f"say {w}"]})
                                 for i, w in enumerate(["def", "class", "list"])), encoding="utf-8")
    text = tiny_head_corpus(tmp_path / "corpus.txt")
    result = CliRunner().invoke(cli, ["distill", "--target", str(target), "-o", str(tmp_path / "h"), "--steps", "3",
                                      "--data", str(prompts), "--data", f"text:{text}", "--seq-len", "16",
                                      "--answer-tokens", "6", "--threads", "1", "--no-progress"])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "h" / "head.json").read_text())
    assert [d["name"] for d in record["data"]] == ["prompts:mine.jsonl", "text:corpus.txt"]
    answered = record["data"][0]
    assert answered["prompts"] == 3 and 0 < answered["loss_tokens"] < answered["tokens"]  # loss on the answers only


def test_self_instruct_requests_are_the_targets_own(tiny_pairs: Callable[..., tuple[Path, Path]]) -> None:
    """--self-instruct N: the target writes N requests from seeded meta-prompts (the same seed, the same requests) and
    answers them; the part is recorded, with the loss on the answers only."""
    from specpack.distill.data import build_corpus

    target_dir = tiny_pairs("qwen2")[1]
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(target_dir)
    config = DistillConfig(stdlib_tokens=0, self_prompts=0, self_instruct=4, answer_tokens=6, generation_batch=2,
                           seq_len=8, threads=1)
    assert self_instruct.meta_prompts(4, 0) == self_instruct.meta_prompts(4, 0) != self_instruct.meta_prompts(4, 1)
    first = self_instruct.write_requests(4, 0, target, tok, 2, int(tok.eos_token_id))
    assert first == self_instruct.write_requests(4, 0, target, tok, 2, int(tok.eos_token_id)) and first
    corpus = build_corpus(config, target, tok, target_weights_sha256(target))
    (part,) = corpus.parts
    assert part["name"] == "self-instruct" and part["requests"] == len(first)
    assert 0 < part["loss_tokens"] < part["tokens"]
    assert part["templates_sha256"] == self_instruct.templates_sha256()


def test_an_earlier_corpus_adds_to_the_default_recipe(tiny_pairs: Callable[..., tuple[Path, Path]],
                                                      tmp_path: Path) -> None:
    """--data corpus:DIR (an earlier run's HEAD/ckpt) joins the default sources, which still run (with another seed,
    new requests): data accumulates across sessions, a part the earlier corpus already holds (the stdlib text) once.
    Recorded with its parts; refused for another target."""
    from specpack.distill.data import build_corpus, recipe

    target_dir = tiny_pairs("qwen2")[1]
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(target_dir)
    sha = target_weights_sha256(target)
    options = {"stdlib_tokens": 300, "self_prompts": 0, "self_instruct": 4, "answer_tokens": 6, "generation_batch": 2,
               "seq_len": 8, "threads": 1}
    first = build_corpus(DistillConfig(**options), target, tok, sha)  # type: ignore[arg-type]
    first.save(tmp_path / "a", key={"target_sha256": sha})
    config = DistillConfig(**options, seed=1, data=(f"corpus:{tmp_path / 'a'}",))  # type: ignore[arg-type]
    assert recipe(config)["sources"] == [f"corpus:{tmp_path / 'a'}", "stdlib", "self", "self-instruct"]
    both = build_corpus(config, target, tok, sha)
    # the stdlib part is the same text as in the earlier corpus: not counted twice
    assert [p["name"] for p in first.parts] == ["stdlib", "self-instruct"]
    assert [p["name"] for p in both.parts] == ["corpus:a", "self-instruct"]
    assert both.parts[0]["sha256"] == ids_sha256(first.ids) and both.parts[0]["parts"] == first.parts
    assert both.parts[1]["sha256"] != first.parts[1]["sha256"]  # seed 1: other requests, other answers
    np.testing.assert_array_equal(both.ids[: first.ids.size], first.ids)
    with pytest.raises(SpecpackError, match="another target"):
        build_corpus(config, target, tok, "0" * 64)


def test_cli_refuses_bad_options(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["distill", "--target", str(tmp_path), "-o", str(tmp_path / "h"), "--steps", "0"])
    assert result.exit_code == 2 and "invalid --steps" in result.output


def test_seed_templates_share_no_8_words_with_the_eval_sets() -> None:
    """The default recipe's prompt templates are not drawn from any evaluation prompt set (8-word overlap = 0)."""
    if not SHARED_PROMPTS.is_dir():
        pytest.skip(f"{SHARED_PROMPTS} is not on this machine")
    words = re.compile(r"[a-z0-9']+")

    def grams(text: str) -> set[tuple[str, ...]]:
        w = words.findall(text.lower())
        return {tuple(w[i:i + 8]) for i in range(len(w) - 7)}

    ours = set().union(*(grams(t.replace("{topic}", "x").replace("{word}", w)) for t in TEMPLATES for w in WORDS))
    ours |= set().union(*(grams(self_instruct.META.format(kind=k, subject=s)) for k in self_instruct.KINDS
                          for s in self_instruct.SUBJECTS))
    for path in sorted(p for p in SHARED_PROMPTS.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".json", ".txt")):
        text = path.read_bytes()[: 64 << 20].decode("utf-8", errors="replace")
        assert not ours & grams(text), path


def test_init_starts_from_an_earlier_heads_weights(tiny_head: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    """--init HEAD: the new run's first weights are that head's trained tensors (not its subset: the new data's), the
    record names it; refused for another target or another shape, as a CLI error (exit 2)."""
    from specpack.distill.trainer import _new_head
    from specpack.distill.warm_start import warm_start
    from specpack.heads.head_file import FROZEN, read_head

    earlier, target_dir = tiny_head()
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    sha = target_weights_sha256(target)
    config = _config(tmp_path, steps=2)
    corpus = Corpus(np.arange(300, dtype=np.int32) % 50, np.ones(300, np.uint8), [])
    head = _new_head(target, config, corpus, target.config.num_hidden_layers)
    trained = load_file(str(earlier / "head.safetensors"))
    assert not all(torch.equal(head.state_dict()[k], v) for k, v in trained.items() if k != "subset")
    warm_start(head, read_head(earlier), sha, str(target_dir))
    state = head.state_dict()
    assert all(torch.equal(state[k], v) for k, v in trained.items() if k != "subset")
    assert not torch.equal(state["subset"], trained["subset"])  # the new data's most frequent tokens
    assert not set(FROZEN) & set(trained)
    with pytest.raises(SpecpackError, match="another target"):
        warm_start(head, read_head(earlier), "0" * 64, str(target_dir))
    other = _new_head(target, DistillConfig(**{**TINY_HEAD_SETTINGS, "subset_size": 100}), corpus,  # type: ignore[arg-type]
                      target.config.num_hidden_layers)
    with pytest.raises(SpecpackError, match="another shape") as err:
        warm_start(other, read_head(earlier), sha, str(target_dir))
    assert "subset_size 100" in str(err.value)

    run = distill(str(target_dir), tmp_path / "next", _config(tmp_path, steps=2, init=str(earlier)))
    record = json.loads((run / "head.json").read_text())
    assert record["training"]["init"]["weights_sha256"] == json.loads((earlier / "head.json").read_text())["weights_sha256"]
    bad = CliRunner().invoke(cli, ["distill", "--target", str(target_dir), "-o", str(tmp_path / "bad"),
                                   "--init", str(tmp_path), "--no-progress"])
    assert bad.exit_code == 2 and "is not a draft head" in bad.output
