"""verl's fully async trainer (``verl.experimental.fully_async_policy``) with verl-mm-tools' step hook.

``python -m verl_mm_tools.step_hook.fully_async <hydra overrides>`` is verl's ``fully_async_main`` (same config,
``fully_async_ppo_trainer``; same rollouter, message queue and checkpoint engine) whose trainer runs
``step.process_step`` on every batch it takes from the rollouter's queue: the ``mm_tool/*`` step metrics (with the
weight versions of partial rollout), the masked-batch guard, the collapse warning, trajectory dumps and per-turn
rewards. verl's own entry point has no hook: its rollouter builds verl's agent-loop manager whatever the config
names, and its trainer assembles batches from the queue without a sampler of ours. Here the trainer subclasses
``FullyAsyncTrainer`` (its ``_fit_generate``, the step's batch) and the task runner subclasses verl's to create it;
both run as Ray actors as verl's do. The entry marks the config (``async_training.step_hook``) so the mm_tool loop
knows the hook runs (``hook_config.step_hook_configured``); with verl's entry, options that need it refuse to start.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import TYPE_CHECKING, Any

import hydra
import ray
from omegaconf import DictConfig, open_dict
from verl.experimental.fully_async_policy import fully_async_main as verl_main
from verl.experimental.fully_async_policy.fully_async_trainer import FullyAsyncTrainer
from verl.trainer.ppo.utils import Role

from verl_mm_tools.adaptations.guard import confirm
from verl_mm_tools.adaptations.record import Adaptation, Section, Target
from verl_mm_tools.agent_loop.hook_config import FULLY_ASYNC_HOOK, FULLY_ASYNC_HOOK_KEY
from verl_mm_tools.step_hook.manager import step_batch
from verl_mm_tools.step_hook.step import CallRateWatch, process_step
from verl_mm_tools.step_metrics import UNVERSIONED_SAMPLES

if TYPE_CHECKING:
    from verl.protocol import DataProto

logger = logging.getLogger(__name__)

# verl's classes under their Ray actor wrappers (``@ray.remote`` replaced the module names)
_VerlTrainer: Any = FullyAsyncTrainer.__ray_actor_class__  # type: ignore[attr-defined]
_VerlTaskRunner: Any = verl_main.FullyAsyncTaskRunner.__ray_actor_class__  # type: ignore[attr-defined]
TRAINER_CPUS = 10  # verl's @ray.remote(num_cpus=10) on FullyAsyncTrainer
CONFIG_DIR = os.path.join(os.path.dirname(verl_main.__file__), "config")


FULLY_ASYNC_MODULE = "verl.experimental.fully_async_policy.fully_async_main"
ADAPTATION = Adaptation(
    section=Section.EXTENSIONS,
    targets=(
        Target(
            "verl.experimental.fully_async_policy.fully_async_trainer",
            "FullyAsyncTrainer.__ray_actor_class__._fit_generate",
            "d118db6cb8d5af80c4350c80cb4c3487d80a3e02d596f5254808167d43f04653",
        ),
        Target(
            FULLY_ASYNC_MODULE,
            "FullyAsyncTaskRunner.__ray_actor_class__._create_trainer",
            "5068b54486dfcbaaf26a7c6713c0d01059b3c7b23e283464d430ec82bc9ea765",
        ),
        Target(FULLY_ASYNC_MODULE, "main", "484e81c5352d0dfdeed8d54d53308d4a38f242effd037e1608ebf0f9893675f0"),
    ),
    what=(
        "the fully async trainer's step hook (`python -m verl_mm_tools.step_hook.fully_async`): runs "
        "`step.process_step` on each batch the trainer takes from the rollouter's queue (after verl's "
        "`_fit_generate`; metrics into the step's `self.metrics`); copies the task runner's `_create_trainer` "
        "and verl's `main` to create that trainer and mark the config (`async_training.step_hook`)"
    ),
    why=(
        "verl's fully async rollouter builds verl's agent-loop manager whatever the config names and its "
        "trainer takes no custom sampler: no hook point is configurable"
    ),
    applies_to="verl 0.9.1 fully async trainer (`verl.experimental.fully_async_policy`)",
    proof="none (an extension); it runs in `tests/demo/test_fully_async_on_cpu.py`",
)


@ADAPTATION.implements
class MMToolFullyAsyncTrainer(_VerlTrainer):
    """verl's ``FullyAsyncTrainer``, running ``process_step`` on each step's batch: its metrics join the step's
    (``self.metrics``, which verl logs), per-turn rewards land in the batch's ``rm_scores`` before the advantage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # verl's, passed on
        confirm(ADAPTATION)  # the verl methods it overrides or copies changed: refuses to start
        super().__init__(*args, **kwargs)

    @functools.cached_property
    def call_rate_watch(self) -> CallRateWatch:
        return CallRateWatch()

    async def _fit_generate(self, batch: DataProto | None = None) -> DataProto:
        batch = await super()._fit_generate(batch)
        meta_info = {"global_steps": self.global_steps, "validate": False}
        metrics = process_step(step_batch(batch, meta_info, batch.non_tensor_batch.get("uid")), self.call_rate_watch)
        self.metrics.update(metrics)
        # counted where verl assembled the batch (adaptations.fixes.fully_async_versions)
        self.metrics[UNVERSIONED_SAMPLES] = batch.meta_info.pop(UNVERSIONED_SAMPLES, 0.0)
        return batch


@ADAPTATION.implements
class MMToolFullyAsyncTaskRunner(_VerlTaskRunner):
    """verl's ``FullyAsyncTaskRunner``, creating ``MMToolFullyAsyncTrainer`` (its ``_create_trainer``, copied)."""

    def _create_trainer(self, config: DictConfig) -> None:
        trainer_role_mapping = {
            role: worker_cls
            for role, worker_cls in self.components["role_worker_mapping"].items()
            if role != Role.Rollout
        }
        trainer = ray.remote(num_cpus=TRAINER_CPUS)(MMToolFullyAsyncTrainer).remote(
            config=config,
            tokenizer=self.components["tokenizer"],
            role_worker_mapping=trainer_role_mapping,
            resource_pool_manager=verl_main.create_resource_pool_manager(
                config, roles=list(trainer_role_mapping.keys())
            ),
            ray_worker_group_cls=self.components["ray_worker_group_cls"],
            device_name=config.trainer.device,
        )
        ray.get(trainer.init_workers.remote())
        self.components["trainer"] = trainer


@hydra.main(config_path=CONFIG_DIR, config_name="fully_async_ppo_trainer", version_base=None)
@ADAPTATION.implements
def main(config: DictConfig) -> None:
    """verl's ``fully_async_main.main`` with the task runner above, the config marked as hooked."""
    from verl.trainer.main_ppo import run_ppo

    confirm(ADAPTATION)
    verl_main.auto_set_device(config)
    config.actor_rollout_ref.rollout.nnodes = config.rollout.nnodes
    config.actor_rollout_ref.rollout.n_gpus_per_node = config.rollout.n_gpus_per_node
    config = verl_main.migrate_legacy_reward_impl(config)
    with open_dict(config):
        config.async_training[FULLY_ASYNC_HOOK_KEY] = FULLY_ASYNC_HOOK
    run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(MMToolFullyAsyncTaskRunner))


if __name__ == "__main__":
    # Run from the module by its name: Ray pickles the actor classes by reference, which ``__main__``'s are not.
    from verl_mm_tools.step_hook.fully_async import main as hooked_main

    hooked_main()
