#!/usr/bin/env bash
# INFER_BACKEND=vllm|sglang examples/recipes/run_rotation_45.sh [hydra overrides...]
exec "$(dirname "$0")/run.sh" rotation_45 "$@"
