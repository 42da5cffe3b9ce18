#!/usr/bin/env bash
# Launch a verl-mm-tools GPU recipe with verl's own trainer:
#   INFER_BACKEND=vllm|sglang examples/recipes/run.sh <recipe: rotation_180|rotation_45|geo3k_retry|zoom|code|miniwob|video|judge> [overrides]
# e.g. INFER_BACKEND=sglang examples/recipes/run.sh rotation_45 trainer.n_gpus_per_node=4
# Install the backend first: pip install -e '.[vllm]' or -e '.[sglang]'.
set -euo pipefail
name=${1:?usage: run.sh <rotation_180|rotation_45|geo3k_retry|zoom|code|miniwob|video|judge> [hydra overrides...]}
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"  # the recipes name their tool and agent-loop YAMLs relative to the repository root
backend=${INFER_BACKEND:-vllm}
case "$backend" in
  vllm | sglang) ;;
  *) echo "INFER_BACKEND must be vllm or sglang, got '$backend'" >&2; exit 2 ;;
esac
exec python -m verl.trainer.main_ppo --config-path="$root/examples/recipes" --config-name="$name" \
  actor_rollout_ref.rollout.name="$backend" "$@"
