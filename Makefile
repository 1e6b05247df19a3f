# Two set-up commands, sharing one environment (.venv): `make demo` (the main job) and `make test`.
# `make demo` installs only what exporting and benchmarking need (the `demo` extra); `make test` adds the dev tools.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TENSORRT_STUBS := 10.13.0.35.1
SPECPACK_CACHE ?= $(HOME)/.cache/specpack
# The pack a CPU user should use: int4 weights for both models (bench/README.md, "Quantized packs of the GGUF pair").
DEMO_PACK ?= $(SPECPACK_CACHE)/packs/qwen2.5-coder-int4
# The fp32 pack (`--dequantize`) the committed CPU benchmark (`make bench-full`) was measured on.
FP32_PACK ?= $(SPECPACK_CACHE)/packs/qwen2.5-coder-0.5b-1.5b
DEMO_PROMPT ?= def quicksort(arr):\n    """Sort a list of numbers in ascending order."""\n
# The standard prompt sets (Spec-Bench, MT-bench, HumanEval, GSM8K) are not in this repository: `specpack fetch
# --prompts all` gets them into $(SPECPACK_CACHE)/prompts (docs/prompts.md); point PROMPTS_DIR at the folder that holds them.
PROMPTS_DIR ?= ../shared/data/prompts

# pytest-xdist workers, each on a core of its own (tests/conftest.py); `make test WORKERS=0` runs in one process;
# PYTEST_ARGS: more pytest options (e.g. "--durations=30", or "-k NAME")
WORKERS ?= auto
PYTEST_ARGS ?=
PYTEST := $(PY) -m pytest -q -n $(WORKERS) --dist loadscope $(PYTEST_ARGS)

.PHONY: install install-demo test test-slow test-all lint demo pack pack-fp32 bench bench-full check-prompts shell clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps tensorrt-stubs==$(TENSORRT_STUBS)  # type stubs only (docs/tensorrt.md)
	touch $@

# the demo's own set: the runtime, export (torch, transformers, onnx, gguf), bench and serve; a dev install covers it
install-demo: $(VENV)/.installed-demo

$(VENV)/.installed-demo: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	if [ -f $(VENV)/.installed ] && [ $(VENV)/.installed -nt pyproject.toml ]; then :; else \
	  $(PY) -m pip install -q --upgrade pip && $(PY) -m pip install -q -e ".[demo]"; fi
	touch $@

# everything but the `slow` set (docs/testing.md says what is in it and why); test-all: everything
test: install
	$(PYTEST) -m "not slow"

test-slow: install
	$(PYTEST) -m slow

test-all: install
	$(PYTEST)

lint: install
	$(VENV)/bin/ruff check specpack tests bench tools
	$(VENV)/bin/lint-imports  # the layering (docs/architecture.md, "Layers, enforced")
	$(PY) tools/tensorrt_stubs.py
	$(VENV)/bin/mypy

# Fetch the real Qwen2.5-Coder pair (GGUF, 1.6 GB) and export the int4 pack (both models int4: the GGUF's Q4_K tensors
# fit from their own blocks, the rest k-quant searched; the two GGUF files convert at once), in the static KV cache form
# (GroupQueryAttention over fixed buffers: 1.06-1.17x the concat form's tokens/s on the project's 2-core VMs,
# bench/README.md, "The static form on the CPU, again"). Every phase prints its
# time; `make demo` on a fresh clone measured 8 min 11 s and 7.61 GB peak memory on the 2-core AMD EPYC VM, shared
# (load average about 1.5), 2026-11-28 (README.md, "Requirements, as measured"). The demo leaves out the fidelity
# measurement (--no-fidelity: a minute, and the fp32 target's graph in memory; this pack's was measured in
# bench/README.md, "Quantized packs of the GGUF pair") and, once the pack is written, removes the pair's converted
# fp32 copies (9 GB; a later export from the GGUF files converts again, 2-3 minutes). KEEP_CONVERTED=1 keeps them.
KEEP_CONVERTED ?=
pack: install-demo
	test -f $(DEMO_PACK)/manifest.json || { $(VENV)/bin/spec-export \
	  --draft "$$($(VENV)/bin/specpack fetch qwen2.5-coder-0.5b-instruct-q4_k_m)" \
	  --target "$$($(VENV)/bin/specpack fetch qwen2.5-coder-1.5b-instruct-q4_k_m)" \
	  -o $(DEMO_PACK) --k 4 --max-len 1024 --quantize-draft int4 --quantize-target int4 --kv-cache static --no-fidelity \
	  && { test -n "$(KEEP_CONVERTED)" || rm -rf $(SPECPACK_CACHE)/converted/qwen2.5-coder-0.5b-instruct-q4_k_m-* \
	    $(SPECPACK_CACHE)/converted/qwen2.5-coder-1.5b-instruct-q4_k_m-*; }; }
	@echo "pack: $(DEMO_PACK)"

# The fp32 pack (`--dequantize`: 9.6 GB) the first CPU numbers in bench/README.md were measured on.
pack-fp32: install-demo
	test -f $(FP32_PACK)/manifest.json || $(VENV)/bin/spec-export \
	  --draft "$$($(VENV)/bin/specpack fetch qwen2.5-coder-0.5b-instruct-q4_k_m)" \
	  --target "$$($(VENV)/bin/specpack fetch qwen2.5-coder-1.5b-instruct-q4_k_m)" \
	  -o $(FP32_PACK) --k 4 --max-len 1024 --dequantize

# One load of the pack, the target alone then speculative decoding on the same prompt, side by side.
demo: pack
	$(VENV)/bin/specpack compare $(DEMO_PACK) --prompt "$$(printf '$(DEMO_PROMPT)')" --max-new-tokens 96
	@echo
	@echo "The pack is at $(DEMO_PACK). Next (README.md, \"After the demo\"):"
	@echo "  source $(VENV)/bin/activate      # or run $(VENV)/bin/specpack"
	@echo "  specpack generate $(DEMO_PACK) --prompt 'def fib(n):'"
	@echo "  specpack serve $(DEMO_PACK)      # OpenAI-compatible, model name: $(notdir $(DEMO_PACK))"
	@echo "  make bench                        # the smoke benchmark, a few minutes"

# A smoke benchmark of the demo pack on the prompts shipped in bench/prompts/ (our own; docs/prompts.md).
bench: pack
	$(VENV)/bin/specpack bench $(DEMO_PACK) --prompts bench/prompts/code.txt --prompts bench/prompts/chat.jsonl \
	  --limit 2 --k 2,4,auto --max-new-tokens 64

# The committed CPU benchmark (bench/README.md) on the fp32 pack and the standard prompt sets in PROMPTS_DIR,
# 45 minutes measured on 2 cores (shared).
bench-full: check-prompts pack-fp32
	PROMPTS_DIR=$(abspath $(PROMPTS_DIR)) SPECPACK=$(VENV)/bin/specpack bash bench/run_cpu.sh $(FP32_PACK)

# before any export: the prompt sets bench-full reads (by path; never copied into the repository)
check-prompts:
	@for f in HumanEval.jsonl.gz mt_bench_question.jsonl gsm8k_test.jsonl; do test -f "$(PROMPTS_DIR)/$$f" || { \
	  echo "error: no $$f in PROMPTS_DIR=$(PROMPTS_DIR)" >&2; \
	  echo "  hint: .venv/bin/specpack fetch --prompts all (docs/prompts.md), then: make bench-full PROMPTS_DIR=$(SPECPACK_CACHE)/prompts" >&2; \
	  exit 2; }; done

# A shell with the environment active (`exit` leaves it)
shell: install-demo
	@echo "specpack's environment is active (.venv); exit to leave it"
	@bash --rcfile $(VENV)/bin/activate -i

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .typing
