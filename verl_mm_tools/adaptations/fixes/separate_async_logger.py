"""verl's v1 separate_async trainer without replicas beside the trainer (``actor_rollout_ref.hybrid_engine=false``,
rollout on the standalone pool only) fails at start-up: ``PPOTrainerSeparateAsync._setup`` logs that mode with
``logger.info(..., flush=True)``, a ``print`` keyword that ``logging`` refuses ("TypeError: Logger._log() got an
unexpected keyword argument 'flush'"). Fixed: that module's logger takes and ignores ``flush``."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, MutableMapping
from typing import Any

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

SEPARATE_ASYNC_MODULE = "verl.trainer.ppo.v1.trainer_separate_async"
TARGET = Target(
    SEPARATE_ASYNC_MODULE,
    "PPOTrainerSeparateAsync._setup",
    "792593a969da40cff043ead652eb55f8dd1f3f21882808f25b579632718c36b5",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="the module's logger ignores the `flush` keyword its `_setup` passes",
    why="with `actor_rollout_ref.hybrid_engine=false` the trainer's start-up raises `TypeError: Logger._log() got an "
    "unexpected keyword argument 'flush'`: separate_async could not run on its standalone rollout alone (what the "
    "CPU run uses)",
    applies_to=VERL,
    proof="`tests/adaptations/test_verl_fixes_on_cpu.py::"
    "test_verls_separate_async_logs_with_a_keyword_logging_refuses_and_the_fix_logs_it`; the separate_async run of "
    "`tests/demo/test_demo_e2e_on_cpu.py`",
)


@ADAPTATION.implements
class FlushIgnoringLogger(logging.LoggerAdapter):
    """A logger that takes ``print``'s ``flush`` keyword and drops it (logging handlers flush each record anyway)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs.pop("flush", None)
        return msg, kwargs


# _setup: checked only (it logs with flush=True); the module's logger is what changes
@ADAPTATION.installs
def install(_setup: Callable[..., None]) -> None:
    """The module's logger as a ``FlushIgnoringLogger``."""
    module: Any = importlib.import_module(SEPARATE_ASYNC_MODULE)
    if not isinstance(module.logger, FlushIgnoringLogger):
        module.logger = FlushIgnoringLogger(module.logger, {})
