#!/usr/bin/env bash
# INFER_BACKEND=vllm|sglang examples/recipes/run_geo3k_retry.sh [hydra overrides...]
exec "$(dirname "$0")/run.sh" geo3k_retry "$@"
