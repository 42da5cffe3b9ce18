#!/usr/bin/env bash
# INFER_BACKEND=vllm|sglang examples/recipes/run_rotation_180.sh [hydra overrides...]
exec "$(dirname "$0")/run.sh" rotation_180 "$@"
