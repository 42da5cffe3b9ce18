"""verl plugin entry point (``verl.plugins: mm_tools = verl_mm_tools.plugin``): importing it registers everything.

verl's loader swallows plugin import errors at DEBUG level, so a broken plugin would silently vanish. This module
logs every failure at ERROR with the traceback before re-raising, and refuses to overwrite a name another package
registered (``PluginRegistrationError`` naming both).

Each registration runs when verl imports the module that holds its registry (``verl_registry.when_imported``): the
agent loop (by name: verl's registry holds ``{"_target_": class path}``, as verl's own ``register`` writes it), the
reward managers, the advantage estimator, the CPU backend's checkpoint engine and rollout. Importing those modules
here (verl's agent loop pulls fastapi and datasets, its reward loop and checkpoint engines vLLM and torch's inductor)
would make every ``import verl`` pay for them: every Ray actor, rollout and reward worker of a run imports verl.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

from verl_mm_tools.adaptations.record import Adaptation, Section, Target
from verl_mm_tools.verl_registry import register_unique, when_imported

logger = logging.getLogger(__name__)

VERL_AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
LOOP_NAME = "mm_tool"  # the name verl's agent-loop registry knows the loop by
LOOP_TARGET = "verl_mm_tools.agent_loop.MMToolAgentLoop"  # its class path: the ``_target_`` of a loop config entry
# name -> class path; tests/test_plugin_on_cpu.py checks each path imports to the loop class
AGENT_LOOPS = {LOOP_NAME: LOOP_TARGET}
REWARD_MANAGERS_MODULE = "verl.experimental.reward_loop.reward_manager"
ADVANTAGES_MODULE = "verl.trainer.ppo.core_algos"

REPORTED_FAILURES = Adaptation(
    section=Section.IMPORT_ORDER,
    what="logs any registration failure at ERROR with its traceback, then re-raises (the lazily "
    "registered agent loop: logs only, so verl's agent-loop module stays usable)",
    why="verl's entry-point loader logs a failing plugin at DEBUG: a broken plugin would silently vanish",
    applies_to="verl 0.9.1",
    proof="`tests/test_plugin_on_cpu.py::test_verls_own_loader_still_hides_a_failing_plugin_below_info` "
    "(added with this inventory)",
)
AGENT_LOOP_REGISTRATION = Adaptation(
    section=Section.PRIVATE_STATE,
    targets=(
        Target(
            "verl.experimental.agent_loop.agent_loop",
            "register",
            "d4713a91cdbbbe838a94a77d7089c113f63b95b0d635796db0b24c5fb25389bb",
        ),
    ),
    what='writes `{"_target_": "verl_mm_tools.agent_loop.MMToolAgentLoop"}` into `_agent_loop_registry` directly',
    why="verl's `register` decorator needs the class, whose import costs seconds at every `import verl`",
    applies_to="verl 0.9.1",
    proof="none (not a bug); works: "
    "`tests/test_plugin_on_cpu.py::test_import_verl_registers_mm_tool_through_the_installed_entry_point`",
)


@AGENT_LOOP_REGISTRATION.implements
def register_agent_loops_into(verl_agent_loop: ModuleType) -> None:
    for name, target in AGENT_LOOPS.items():
        register_unique(verl_agent_loop._agent_loop_registry, name, {"_target_": target}, "agent loop")


def register_reward_managers_into(_package: ModuleType) -> None:
    # the module registers its classes once defined. Where it is being imported already (it imported verl's
    # package), this returns it unfinished, and it registers them at its end.
    importlib.import_module("verl_mm_tools.rewards.managers")


def register_advantage_estimators_into(core_algos: ModuleType) -> None:
    from verl_mm_tools.rewards.turn_credit import ESTIMATOR_NAME, compute_turn_grpo_advantage

    register_unique(
        core_algos.ADV_ESTIMATOR_REGISTRY, ESTIMATOR_NAME, compute_turn_grpo_advantage, "advantage estimator"
    )


def register_cpu_backend() -> None:
    """The CPU platform and the ``hf`` rollout: inert unless VERL_PLATFORM=cpu / rollout.name=hf select them."""
    from verl_mm_tools.cpu import register_cpu_backend as register

    register()


def apply_verl_fixes() -> None:
    """Fixes for verl bugs any run can hit, and the ``remote:`` key of verl's tool YAML (``adaptations.fixes``), each
    when verl imports the module it changes."""
    from verl_mm_tools.adaptations.fixes import apply_verl_fixes as apply

    apply()


def register_all() -> None:
    apply_verl_fixes()
    when_imported(VERL_AGENT_LOOP_MODULE, register_agent_loops_into, "agent loops (mm_tool)")
    when_imported(REWARD_MANAGERS_MODULE, register_reward_managers_into, "reward managers")
    when_imported(ADVANTAGES_MODULE, register_advantage_estimators_into, "advantage estimator")
    register_cpu_backend()


@REPORTED_FAILURES.implements
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
