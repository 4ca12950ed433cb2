#!/usr/bin/env bash
# Build llama.cpp's llama-server from the sources the llama-cpp-python sdist vendors (PyPI only),
# for tests/backends/native/real_llamacpp (marker `llamacpp`). Usage: tests/backends/native/real_llamacpp/build_server.sh OUT_DIR
#   then: GATEWAY_LLAMA_SERVER=OUT_DIR/llama-server .venv/bin/pip install gguf && .venv/bin/pytest -m llamacpp
#
# Not run by CI: measured on the 2-core CI machine (llama-cpp-python 0.3.36), the sdist download
# took ~40 s and the CPU-only build of the llama-server target alone 33 min (1,969 s), too much of
# CI's 90-minute budget next to the rest of .ci/run.
set -euo pipefail
out=${1:?usage: build_server.sh OUT_DIR}
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work" -q
tar xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
cmake --build "$work/build" -j"$(nproc)" --target llama-server
mkdir -p "$out"
cp "$work/build/bin/llama-server" "$out/"
echo "built $out/llama-server"
