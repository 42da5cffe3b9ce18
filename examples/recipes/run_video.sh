#!/usr/bin/env bash
# INFER_BACKEND=vllm examples/recipes/run_video.sh [hydra overrides...]
exec "$(dirname "$0")/run.sh" video "$@"
