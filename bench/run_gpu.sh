#!/usr/bin/env bash
# One device call's share of the GPU benchmark (bench/README.md, "GPU"), on the test GPU after staging:
#
#   ../shared/device/stage ort-gpu                     # here: downloads the wheels into ~/.cache/device-stage
#   ../shared/device/stage WHEELS... D.gguf T.gguf PROMPTS...  # here: everything in one set of parts
#   bash .device/unpack.sh N                           # there, once per part, back to back
#   bash bench/run_gpu.sh PART                         # there: PART = one of those below
#
#   builder   the pair exported with the model builder's graphs (spec-export --graphs builder --dtype fp16 --ep cuda),
#             4 HumanEval + 4 MT-bench prompts: autoregressive, the model drafter at k 4 and adaptive, the n-gram
#             drafter at k 4 and adaptive; step costs (bench/gpu.py --phases card,genai_pack)
#   drafters  the same pack per Spec-Bench category and HumanEval, every config, median of --repeat 3
#             (bench/drafters.py --device cuda, step costs measured in the run)
#   peers     onnxruntime-genai on the same prompts (autoregressive with and without CUDA graphs, speculative),
#             the top-2 logit gap at every greedy divergence, the summary fields (bench/gpu.py --phases
#             genai,divergences,summary); then the marked GPU tests (pytest -m gpu tests/gpu)
#   shapes    random fp16 models at the 0.5B / 7B / 1.5B shapes exported with the model builder's graphs, step costs
#             with and without CUDA graphs (bench/gpu.py --phases card,shapes --graphs builder); needs only the
#             wheels and a Qwen2.5 tokenizer folder staged (e.g. a pack's tokenizer/), no GGUF; may take two calls
#             (the 7B export): a second call finds the packs written and goes on
#   plain     (the device's CPU side, 128 GB: the quantized target's fidelity, which a 23.5 GB machine could not
#             calibrate) the GGUF pair converted and exported as plain fp32 graphs; needs the GGUFs, the prompts
#             and the `quantize` extra's wheels staged, not ort-gpu
#   calibrated METHOD  the target quantized by METHOD (fp8 | int8-sq) and its top-1 agreement and mean KL against
#             the fp32 target, teacher-forced on 8 HumanEval + 8 MT-bench prompts (bench/calibrated_draft.py
#             --target-methods METHOD); results in calibrated_target.json. The device's onnxruntime (1.30) refuses
#             modelopt's FP8 Q/DQ graphs: stage the CPU onnxruntime 1.32 wheel renamed to *.whl.cpu (so unpack.sh
#             leaves it alone), it is installed into /tmp/site-cpu for this part only. Long: start it with setsid
#             in the background and collect calibrated_target.json from /tmp/gpuwork later (part `collect`)
#   int4      the builder part with int4 weights: our pack exported with --quantize-draft/--quantize-target int4
#             (the model builder's quantizer, export/builder_export.py) beside onnxruntime-genai's own int4 model
#             of the same target, autoregressive with CUDA graphs, same prompts and run (gpu-h200-int4.json)
#   rows      one row alone against two rows (docs/architecture.md, "One row is never run alone"): the target alone
#             exported fp16 and int4 (n-gram packs of the target GGUF, builder graphs), bench/row_invariance.py on 8
#             HumanEval + 8 MT-bench prompts, 128 tokens; needs the target GGUF and the prompts staged, not the draft
#   collect   copy every result under /tmp/gpuwork (JSON, logs) to $OUT
# Results go to $OUT (the device tool brings them back): gpu-<card>-builder.json, drafters_gpu.json, gpu_tests.txt.
set -uo pipefail
part=${1:?usage: run_gpu.sh builder|drafters|peers|shapes|plain|calibrated METHOD|int4|rows|collect}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
staged=/tmp/stage/files
models=$(dirname "$(find $staged -name 'qwen2.5-coder-1.5b-instruct-q4_k_m.gguf' | head -1)")
prompts=$(dirname "$(find $staged -name 'HumanEval.jsonl.gz' | head -1)")
work=/tmp/gpuwork
out=${OUT:-/tmp/out}
mkdir -p "$work" "$out"
json=$work/gpu-h200-builder.json  # kept on the machine between calls; copied to $OUT after each
[[ $part == shapes ]] && json=$work/gpu-h200-shapes-builder.json
[[ $part == int4 ]] && json=$work/gpu-h200-int4.json
gpu=(python3 bench/gpu.py --work "$work" --json "$json" --draft-gguf "$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
     --target-gguf "$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
     --prompts "$prompts/HumanEval.jsonl.gz" "$prompts/mt_bench_question.jsonl" --k 4)
case $part in
  builder)
    python3 -c 'import onnxruntime as o, onnxruntime_genai as g; print(o.__version__, o.get_available_providers(), g.__version__)'
    "${gpu[@]}" --phases card,genai_pack --configs model:auto,ngram:4,ngram:auto ;;
  drafters)
    python3 bench/drafters.py "$work/pack-genai" --device cuda --out "$out/drafters_gpu.json" \
      --spec-bench "$prompts/spec_bench_question.jsonl" --humaneval "$prompts/HumanEval.jsonl.gz" \
      --prompts-per-category 4 --max-new-tokens 128 --repeat 3 ;;
  peers)
    "${gpu[@]}" --phases genai,divergences,summary
    python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -x 2>&1 | tee "$out/gpu_tests.txt" | tail -5 ;;
  shapes)
    tokenizer=$(dirname "$(find $staged -name tokenizer.json | head -1)")
    python3 bench/gpu.py --work "$work" --json "$json" --tokenizer "$tokenizer" --phases card,shapes --graphs builder \
      --targets 7b 1.5b ;;
  plain)
    python3 - "$models" "$work/plain" <<'PY'
import sys
from pathlib import Path
from specpack.export.gguf import convert_gguf
from specpack.export.torch_export import export_plain_graph
models, plain = Path(sys.argv[1]), Path(sys.argv[2])
plain.mkdir(parents=True, exist_ok=True)
for role, size in (("draft", "0.5b"), ("target", "1.5b")):
    model_dir = convert_gguf(models / f"qwen2.5-coder-{size}-instruct-q4_k_m.gguf")
    (plain / f"{role}.dir").write_text(str(model_dir))
    if not (plain / f"{role}.onnx").exists():
        export_plain_graph(model_dir, plain / f"{role}.onnx")
    print(role, model_dir, flush=True)
PY
    ;;
  int4)
    "${gpu[@]}" --quantize int4 --phases card,genai_pack,genai,summary --configs ngram:4 ;;
  rows)
    for q in none int4; do
      pack=$work/rows-$q
      weights=(--dequantize); [[ $q == int4 ]] && weights=(--quantize-target int4)
      [[ -f $pack/manifest.json ]] || python3 -m specpack export --target "$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" \
        --drafter ngram --graphs builder --dtype fp16 --ep cuda "${weights[@]}" --k 8 --max-len 1024 -o "$pack" || exit 1
      for set in HumanEval mt_bench_question; do
        file=$(find "$prompts" -name "$set.json*" | head -1)
        python3 bench/row_invariance.py "$pack" --device cuda --prompts "$file" --limit 8 --max-new-tokens 128 \
          --json "$out/row_invariance_gpu_${q}_${set}.json"
      done
    done
    exit 0 ;;
  collect)
    cp "$work"/*.json "$work"/*.log "$out/" 2>/dev/null; ls -la "$work"; exit 0 ;;
  calibrated)
    method=${2:?usage: run_gpu.sh calibrated fp8|int8-sq}
    cpu_wheel=$(find $staged -name 'onnxruntime-*.whl.cpu' | head -1)
    if [[ -n $cpu_wheel ]]; then
      wheel=/tmp/$(basename "${cpu_wheel%.cpu}")
      cp "$cpu_wheel" "$wheel" && python3 -m pip install -q --no-index --no-deps --target /tmp/site-cpu "$wheel"
      export PYTHONPATH=/tmp/site-cpu:$PYTHONPATH
    fi
    python3 -c 'import onnxruntime as o; print("onnxruntime", o.__version__, o.__file__)'
    python3 bench/calibrated_draft.py --plain-dir "$work/plain" --draft-dir "$(cat "$work/plain/draft.dir")" \
      --target-dir "$(cat "$work/plain/target.dir")" --calib-prompts "$prompts/gsm8k_test.jsonl" \
      --prompts "$prompts/HumanEval.jsonl.gz" "$prompts/mt_bench_question.jsonl" --methods --target-methods "$method" \
      --work "$work/calib" --json "$work/calibrated_target.json" \
      --machine "the H200 machine's host CPU ($(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GB), ONNX Runtime CPU EP"
    cp "$work/calibrated_target.json" "$out/" ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
status=$?
cp "$json" "$out/" 2>/dev/null
exit $status
