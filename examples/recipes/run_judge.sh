#!/usr/bin/env bash
# INFER_BACKEND=vllm examples/recipes/run_judge.sh [hydra overrides...]
exec "$(dirname "$0")/run.sh" judge "$@"
