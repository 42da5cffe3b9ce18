"""verl plugin entry point (``verl.plugins: mm_tools = verl_mm_tools.plugin``): importing it registers everything.

verl's loader swallows plugin import errors at DEBUG level, so a broken plugin would silently vanish. This module
logs every failure at ERROR with the traceback before re-raising, and refuses to overwrite a name another package
registered (``PluginRegistrationError`` naming both).
"""

from __future__ import annotations

import logging

from verl_mm_tools.registry import qualified_name, register_unique

logger = logging.getLogger(__name__)


def agent_loops() -> dict[str, type]:
    from verl_mm_tools.agent_loop import MMToolAgentLoop

    return {"mm_tool": MMToolAgentLoop}


def register_agent_loops() -> None:
    from verl.experimental.agent_loop import agent_loop as verl_agent_loop

    for name, loop_cls in agent_loops().items():
        register_unique(verl_agent_loop._agent_loop_registry, name, {"_target_": qualified_name(loop_cls)}, "agent loop")


def register_reward_managers() -> None:
    from verl.experimental.reward_loop.reward_manager import registry as verl_reward_registry

    from verl_mm_tools.rewards import REWARD_MANAGERS

    for name, manager_cls in REWARD_MANAGERS.items():
        register_unique(verl_reward_registry.REWARD_MANAGER, name, manager_cls, "reward manager")


def register_cpu_backend() -> None:
    """The CPU platform and the ``hf`` rollout: inert unless VERL_PLATFORM=cpu / rollout.name=hf select them."""
    from verl_mm_tools.cpu import register_cpu_backend as register

    register()


def register_advantage_estimators() -> None:
    from verl.trainer.ppo import core_algos

    from verl_mm_tools.rewards.turn_credit import ESTIMATOR_NAME, compute_turn_grpo_advantage

    register_unique(core_algos.ADV_ESTIMATOR_REGISTRY, ESTIMATOR_NAME, compute_turn_grpo_advantage, "advantage estimator")


def register_all() -> None:
    register_agent_loops()
    register_reward_managers()
    register_advantage_estimators()
    register_cpu_backend()


def _register_or_report() -> None:
    try:
        register_all()
    except Exception:
        logger.error(
            "verl-mm-tools failed to register its components with verl; the mm_tool agent loop, image tools and "
            "reward managers are NOT available. Traceback:",
            exc_info=True,
        )
        raise


_register_or_report()
