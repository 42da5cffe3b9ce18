#!/usr/bin/env bash
# INFER_BACKEND=vllm|sglang examples/recipes/run_miniwob.sh [hydra overrides...]
exec "$(dirname "$0")/run.sh" miniwob "$@"
