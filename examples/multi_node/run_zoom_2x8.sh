#!/usr/bin/env bash
# The zoom recipe on 2 nodes x 8 GPUs with verl's separate_async trainer: training (FSDP) on one node's 8 GPUs, the
# vLLM rollout servers on the other's, new weights after every parameter sync over NCCL. Launch it on the head node
# of a running Ray cluster whose nodes were started as docs/multi_node.md says:
#   SHARED=/mnt/shared RAY_ADDRESS=<head ip>:6379 examples/multi_node/run_zoom_2x8.sh [hydra overrides...]
# SHARED: storage every node mounts at the same path (data, checkpoints, dumps; this repository's YAMLs are read there
# too: clone it under SHARED). Checked on CPU: tests/examples/test_multi_node_launch_on_cpu.py composes this command.
set -euo pipefail
shared=${SHARED:?set SHARED to a directory every node mounts at the same path}
root=$(cd "$(dirname "$0")/../.." && pwd)
exec "$root/examples/recipes/run.sh" zoom \
  trainer.v1.trainer_mode=separate_async \
  actor_rollout_ref.hybrid_engine=false \
  trainer.nnodes=1 \
  trainer.n_gpus_per_node=8 \
  actor_rollout_ref.rollout.nnodes=1 \
  actor_rollout_ref.rollout.n_gpus_per_node=8 \
  actor_rollout_ref.rollout.checkpoint_engine.backend=nccl \
  trainer.v1.separate_async.parameter_sync_step=4 \
  "data.train_files=$shared/data/verl_mm_tools/zoom/train.parquet" \
  "data.val_files=$shared/data/verl_mm_tools/zoom/val.parquet" \
  "actor_rollout_ref.rollout.multi_turn.tool_config_path=$root/examples/recipes/zoom/tools.yaml" \
  "actor_rollout_ref.rollout.agent.agent_loop_config_path=$root/examples/recipes/zoom/mm_tool.yaml" \
  "trainer.default_local_dir=$shared/checkpoints/zoom_2x8" \
  "trainer.rollout_data_dir=$shared/rollouts/zoom_2x8" \
  "$@"
