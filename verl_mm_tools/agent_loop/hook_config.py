"""Which trainer-side step hook (``step_hook.step.process_step``) a run has, the overrides that select it, and the
options that cannot work without it (or with it). Read by the mm_tool loop at start-up, the demo and the tests: it
lives here, below ``step_hook/``, because the loop reads it; it names the hook's classes only as strings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from verl_mm_tools.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

MANAGER_FQN = "verl_mm_tools.step_hook.manager.MMToolAgentLoopManager"
# verl's v1 manager, fixed for trajectories returned as several samples (mm_tool export per_turn / auto)
MANAGER_TQ_FQN = "verl_mm_tools.adaptations.manager_tq.MMToolAgentLoopManagerTQ"
MANAGER_TQ_OVERRIDE = f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER_TQ_FQN}"
SAMPLER_PATH = "pkg://verl_mm_tools.step_hook.replay_buffer"
SAMPLER_NAME = "MMToolReplayBuffer"
# verl's fully async trainer (``fully_async_main``, configs with ``async_training``): the hook is an entry point of
# ours, which marks the config with ``async_training.step_hook`` (``step_hook.fully_async``)
FULLY_ASYNC_ENTRY = "verl_mm_tools.step_hook.fully_async"
FULLY_ASYNC_HOOK_KEY = "step_hook"
FULLY_ASYNC_HOOK = f"{FULLY_ASYNC_ENTRY}.MMToolFullyAsyncTrainer"


def uses_fully_async_trainer(trainer_config: DictConfig) -> bool:
    """Whether the config is verl's fully async trainer's (``fully_async_ppo_trainer``: it has ``async_training``)."""
    return "async_training" in trainer_config


def uses_v1_trainer(trainer_config: DictConfig) -> bool:
    """verl's v1 trainer (``main_ppo`` with ``trainer.use_v1``, verl 0.9.1's default); not its fully async one."""
    return bool(trainer_config.trainer.get("use_v1", True)) and not uses_fully_async_trainer(trainer_config)


def how_to_hook(trainer_config: DictConfig) -> str:
    """What selects the step hook of the trainer this config runs, for a message."""
    if uses_fully_async_trainer(trainer_config):
        return f"run python -m {FULLY_ASYNC_ENTRY} (verl's fully_async_main with the hook; same overrides)"
    return "set " + " ".join(hook_overrides(trainer_config))


def hook_overrides(trainer_config: DictConfig | None = None, *, v1: bool | None = None) -> list[str]:
    """The hydra overrides that select the step hook of the trainer this config runs (or of the v1 or classic
    trainer, by ``v1``)."""
    if v1 is None:
        if trainer_config is None:
            raise TypeError("hook_overrides takes a trainer config or v1")
        v1 = uses_v1_trainer(trainer_config)
    if v1:
        return [
            f"trainer.v1.sampler.custom_sampler.path={SAMPLER_PATH}",
            f"trainer.v1.sampler.custom_sampler.name={SAMPLER_NAME}",
        ]
    return [f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER_FQN}"]


def multi_sample_manager_configured(trainer_config: DictConfig) -> bool:
    """Whether the v1 trainer runs ``MMToolAgentLoopManagerTQ`` (or a subclass): needed for several samples per
    trajectory of a multimodal model."""
    return _manager_is(trainer_config, MANAGER_TQ_FQN)


def step_hook_configured(trainer_config: DictConfig) -> bool:
    """Whether ``process_step`` runs in this config's trainer: verl-mm-tools' replay buffer on the v1 trainer, its
    agent-loop manager (or a subclass) on the classic one, its entry point on the fully async one."""
    if uses_fully_async_trainer(trainer_config):
        return trainer_config.async_training.get(FULLY_ASYNC_HOOK_KEY) == FULLY_ASYNC_HOOK
    if uses_v1_trainer(trainer_config):
        sampler = trainer_config.trainer.get("v1", {}).get("sampler", {}).get("custom_sampler") or {}
        return _loads_subclass(sampler.get("path"), sampler.get("name"), SAMPLER_NAME)
    return _manager_is(trainer_config, MANAGER_FQN)


def _manager_is(trainer_config: DictConfig, ours: str) -> bool:
    """Whether the configured agent-loop manager class is ``ours`` (a fully qualified name) or a subclass."""
    agent = trainer_config.actor_rollout_ref.rollout.get("agent") or {}
    module, _, name = str(agent.get("agent_loop_manager_class") or "").rpartition(".")
    return _loads_subclass(f"pkg://{module}" if module else None, name, ours.rpartition(".")[2])


def _loads_subclass(path: str | None, name: str | None, ours: str) -> bool:
    if not path or not name:
        return False
    from verl.utils.import_utils import load_extern_object

    try:
        configured = load_extern_object(path, name)
    except (ImportError, AttributeError, FileNotFoundError, ValueError):
        return False
    return isinstance(configured, type) and any(
        base.__name__ == ours and base.__module__.startswith("verl_mm_tools") for base in configured.__mro__
    )


def require_step_hook(trainer_config: DictConfig, needed_for: str) -> None:
    """Refuse an option that only works with the trainer-side hook when the hook is not configured."""
    if step_hook_configured(trainer_config):
        return
    if uses_fully_async_trainer(trainer_config):
        raise ConfigError(
            f"{needed_for} needs verl-mm-tools' step hook, which verl's fully async trainer gets only through "
            f"verl-mm-tools' entry point: run python -m {FULLY_ASYNC_ENTRY} (same config and overrides) instead of "
            "python -m verl.experimental.fully_async_policy.fully_async_main"
        )
    trainer = "v1 (trainer.use_v1=true, verl's default)" if uses_v1_trainer(trainer_config) else "classic"
    raise ConfigError(
        f"{needed_for} needs verl-mm-tools' step hook, which this run's {trainer} trainer does not have: set "
        + " ".join(hook_overrides(trainer_config))
    )


def refuse_unsupported_with_hook(trainer_config: DictConfig) -> None:
    """verl hands a custom replay buffer no DAPO settings: with ours, ``algorithm.filter_groups`` would silently do
    nothing, so it is refused."""
    filter_groups = trainer_config.algorithm.get("filter_groups") or {}
    if uses_v1_trainer(trainer_config) and filter_groups.get("enable") and step_hook_configured(trainer_config):
        raise ConfigError(
            "algorithm.filter_groups.enable=true (DAPO dynamic sampling) does not work with verl-mm-tools' replay "
            f"buffer: verl gives a custom sampler ({SAMPLER_NAME}) no group-filtering settings, so no group would be "
            "filtered. Drop trainer.v1.sampler.custom_sampler (losing mm_tool step metrics, dumps and mm_turn_grpo) "
            "or disable filter_groups."
        )
