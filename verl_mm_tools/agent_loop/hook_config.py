"""Which trainer-side step hook (``step_hook.step.process_step``) a run has, the overrides that select it, and the
options that cannot work without it (or with it). Read by the mm_tool loop at start-up, the demo and the tests: it
lives here, below ``step_hook/``, because the loop reads it; it names the hook's classes only as strings."""

from __future__ import annotations

from verl_mm_tools.errors import ConfigError

MANAGER_FQN = "verl_mm_tools.step_hook.manager.MMToolAgentLoopManager"
# verl's v1 manager, fixed for trajectories returned as several samples (mm_tool export per_turn / auto)
MANAGER_TQ_FQN = "verl_mm_tools.adaptations.manager_tq.MMToolAgentLoopManagerTQ"
MANAGER_TQ_OVERRIDE = f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER_TQ_FQN}"
SAMPLER_PATH = "pkg://verl_mm_tools.step_hook.replay_buffer"
SAMPLER_NAME = "MMToolReplayBuffer"


def uses_v1_trainer(trainer_config) -> bool:
    return bool(trainer_config.trainer.get("use_v1", True))  # verl 0.9.1's default


def hook_overrides(trainer_config=None, *, v1: bool | None = None) -> list[str]:
    """The hydra overrides that select the step hook of the trainer this config runs (or of the v1 or classic
    trainer, by ``v1``)."""
    if v1 if v1 is not None else uses_v1_trainer(trainer_config):
        return [
            f"trainer.v1.sampler.custom_sampler.path={SAMPLER_PATH}",
            f"trainer.v1.sampler.custom_sampler.name={SAMPLER_NAME}",
        ]
    return [f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER_FQN}"]


def multi_sample_manager_configured(trainer_config) -> bool:
    """Whether the v1 trainer runs ``MMToolAgentLoopManagerTQ`` (or a subclass): needed for several samples per
    trajectory of a multimodal model."""
    return _manager_is(trainer_config, MANAGER_TQ_FQN)


def step_hook_configured(trainer_config) -> bool:
    """Whether ``process_step`` runs in this config's trainer: verl-mm-tools' replay buffer on the v1 trainer, its
    agent-loop manager (or a subclass) on the classic one."""
    if uses_v1_trainer(trainer_config):
        sampler = trainer_config.trainer.get("v1", {}).get("sampler", {}).get("custom_sampler") or {}
        return _loads_subclass(sampler.get("path"), sampler.get("name"), SAMPLER_NAME)
    return _manager_is(trainer_config, MANAGER_FQN)


def _manager_is(trainer_config, ours: str) -> bool:
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


def require_step_hook(trainer_config, needed_for: str) -> None:
    """Refuse an option that only works with the trainer-side hook when the hook is not configured."""
    if step_hook_configured(trainer_config):
        return
    trainer = "v1 (trainer.use_v1=true, verl's default)" if uses_v1_trainer(trainer_config) else "classic"
    raise ConfigError(
        f"{needed_for} needs verl-mm-tools' step hook, which this run's {trainer} trainer does not have: set "
        + " ".join(hook_overrides(trainer_config))
    )


def refuse_unsupported_with_hook(trainer_config) -> None:
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
