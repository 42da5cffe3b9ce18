"""verl's own trainer config, composed through hydra for an in-process run."""

from __future__ import annotations

import os
from collections.abc import Sequence

from omegaconf import DictConfig

from verl_mm_tools.agent_loop.hook_config import MANAGER_TQ_OVERRIDE, hook_overrides

# The runtime runs verl's classic agent-loop worker in-process: configs that stand for a trainer run select the
# classic trainer and its step hook, the manager.
CLASSIC_HOOK = ("trainer.use_v1=false", *hook_overrides(v1=False))
# ... or, for a loop that makes several samples per trajectory, the v1 trainer that takes them (with the manager
# that scores them), which the in-process per-sample worker stands for (``workers.per_sample_worker_class``)
V1_SAMPLES = ("trainer.use_v1=true", MANAGER_TQ_OVERRIDE, *hook_overrides(v1=True))


def compose_trainer_config(model_path: str, overrides: Sequence[str] = ()) -> DictConfig:
    """verl's own ``ppo_trainer`` config through hydra, with the model path and the given overrides."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    base = [
        f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.agent.default_agent_loop=mm_tool",
    ]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[*base, *overrides])
