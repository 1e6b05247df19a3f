#!/usr/bin/env bash
# llama.cpp's tools (the peer of issue 9), built as ../shared/peers/build-llama-cpp does (the C++ source vendored in
# llama-cpp-python 0.3.36), but with GGML_NATIVE=OFF, explicit AVX-512 flags and AMX off: the native build segfaulted
# on an Intel Xeon VM with AMX right after "llama threadpool init", as in llama.cpp issues #20824 and #26954 (AMX tile
# permission per worker thread). Usage: bench/build_llamacpp.sh   (tools in ~/.cache/peers/llama.cpp/build/bin)
set -euo pipefail
out=$HOME/.cache/peers/llama.cpp; mkdir -p $out; cd $out
if [ ! -d src ]; then
  python3 -m pip download -q --no-deps --no-binary :all: -d sdist "llama-cpp-python==0.3.36"
  mkdir -p x && tar -xzf sdist/llama_cpp_python-0.3.36.tar.gz -C x
  mv x/llama_cpp_python-0.3.36/vendor/llama.cpp src && rm -rf x
fi
cmake -S src -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
cmake --build build -j 2 --target llama-completion llama-speculative-simple llama-speculative llama-bench
ls build/bin
