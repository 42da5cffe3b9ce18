"""verl plugin entry point (``verl.plugins: mm_tools = verl_mm_tools.plugin``): importing it registers everything.

verl's loader swallows plugin import errors at DEBUG level, so a broken plugin would silently vanish. This module
logs every failure at ERROR with the traceback before re-raising, and refuses to overwrite a name another package
registered (``PluginRegistrationError`` naming both).

The agent loop is registered by name (verl's registry holds ``{"_target_": class path}``, as verl's own ``register``
writes it) once verl's agent-loop module is imported: importing that module here (it pulls fastapi, datasets, ...)
would make every ``import verl`` pay for it. The reward managers, the advantage estimator and the CPU backend are
registered at once: verl's registries for them hold the objects themselves.
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType

from verl_mm_tools.adaptations.import_order import call_after_import
from verl_mm_tools.verl_registry import register_unique

logger = logging.getLogger(__name__)

VERL_AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
LOOP_NAME = "mm_tool"  # the name verl's agent-loop registry knows the loop by
LOOP_TARGET = "verl_mm_tools.agent_loop.MMToolAgentLoop"  # its class path: the ``_target_`` of a loop config entry
# name -> class path; tests/test_plugin_on_cpu.py checks each path imports to the loop class
AGENT_LOOPS = {LOOP_NAME: LOOP_TARGET}


def register_agent_loops_into(verl_agent_loop: ModuleType) -> None:
    for name, target in AGENT_LOOPS.items():
        register_unique(verl_agent_loop._agent_loop_registry, name, {"_target_": target}, "agent loop")


def _register_agent_loops_or_report(verl_agent_loop: ModuleType) -> None:
    try:
        register_agent_loops_into(verl_agent_loop)
    except Exception:
        # verl's agent-loop module itself imported fine: keep it usable, without our loop
        logger.error(
            "verl-mm-tools failed to register its agent loops with verl; the mm_tool agent loop is NOT "
            "available. Traceback:",
            exc_info=True,
        )


def register_agent_loops() -> None:
    if VERL_AGENT_LOOP_MODULE in sys.modules:  # imported already: a failure raises, like every other registration
        register_agent_loops_into(sys.modules[VERL_AGENT_LOOP_MODULE])
    else:
        call_after_import(VERL_AGENT_LOOP_MODULE, _register_agent_loops_or_report)


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

    register_unique(
        core_algos.ADV_ESTIMATOR_REGISTRY, ESTIMATOR_NAME, compute_turn_grpo_advantage, "advantage estimator"
    )


def apply_verl_fixes() -> None:
    """Fixes for verl bugs any run can hit, and the ``remote:`` key of verl's tool YAML (``adaptations.fixes``), each
    when verl imports the module it changes."""
    from verl_mm_tools.adaptations.fixes import apply_verl_fixes as apply

    apply()


def register_all() -> None:
    apply_verl_fixes()
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
