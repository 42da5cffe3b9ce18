"""The 2 nodes x 8 GPUs launch of docs/multi_node.md (examples/multi_node/run_zoom_2x8.sh) composes through verl's
hydra config on top of the zoom recipe: separate_async with the trainer's pool on one node's 8 GPUs and the rollout's
on the other's, every path on the shared storage or absolute."""

from __future__ import annotations

import shlex
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "multi_node" / "run_zoom_2x8.sh"
SHARED = "/mnt/shared"


def script_overrides() -> tuple[str, list[str]]:
    """The recipe and the hydra overrides the script passes to run.sh, with $shared and $root expanded."""
    text = SCRIPT.read_text()
    command = text[text.index('exec "$root/examples/recipes/run.sh"') :].replace("\\\n", " ")
    words = shlex.split(command.replace("$shared", SHARED).replace("$root", str(ROOT)))
    assert words[:2] == ["exec", f"{ROOT}/examples/recipes/run.sh"] and words[-1] == "$@"
    return words[2], words[3:-1]


def test_the_2x8_launch_composes_with_the_trainer_and_the_rollout_on_a_node_each():
    recipe, overrides = script_overrides()
    with initialize_config_dir(config_dir=str(ROOT / "examples" / "recipes"), version_base=None):
        config = compose(config_name=recipe, overrides=["actor_rollout_ref.rollout.name=vllm", *overrides])
    OmegaConf.to_container(config, resolve=True)
    trainer, rollout = config.trainer, config.actor_rollout_ref.rollout
    assert trainer.v1.trainer_mode == "separate_async" and config.actor_rollout_ref.hybrid_engine is False
    assert (trainer.nnodes, trainer.n_gpus_per_node, rollout.nnodes, rollout.n_gpus_per_node) == (1, 8, 1, 8)
    assert rollout.checkpoint_engine.backend == "nccl"
    # verl's separate_async trainer asserts train_batch_size == parameter_sync_step * ppo_mini_batch_size
    sync = trainer.v1.separate_async.parameter_sync_step
    assert config.data.train_batch_size == sync * config.actor_rollout_ref.actor.ppo_mini_batch_size
    for path in (config.data.train_files, config.data.val_files, trainer.default_local_dir, trainer.rollout_data_dir):
        assert str(path).startswith(f"{SHARED}/")
    for path in (rollout.multi_turn.tool_config_path, rollout.agent.agent_loop_config_path):
        assert Path(path).is_absolute() and Path(path).is_file()  # read by workers on both nodes
