"""The classic trainer's (``trainer.use_v1=false``) step hook: an AgentLoopManager that runs ``step.process_step``
on every generated batch (step metrics, the masked-batch guard, trajectory dumps, per-turn rewards).

verl's classic trainer logs only two per-trajectory fields of an agent loop (``__num_turns__`` and
``tool_call_counts``); the one other channel from rollout to the logger is the manager's ``meta_info["timing"]``,
which the trainer logs as ``timing_s/<name>``. Select this manager with
``+actor_rollout_ref.rollout.agent.agent_loop_manager_class=verl_mm_tools.step_hook.manager.MMToolAgentLoopManager``
and the step metrics appear as ``timing_s/mm_tool/...`` (e.g. ``timing_s/mm_tool/images/mean``). On verl's default
v1 trainer the hook is ``replay_buffer.MMToolReplayBuffer`` and the names have no ``timing_s/`` prefix.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from verl.experimental.agent_loop.agent_loop import AgentLoopManager
from verl.protocol import DataProto
from verl.utils.ray_utils import auto_await

from verl_mm_tools.adaptations.guard import confirm
from verl_mm_tools.adaptations.record import Adaptation, Section, Target
from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.step_hook.batch import StepBatch
from verl_mm_tools.step_hook.step import CallRateWatch, process_step

if TYPE_CHECKING:
    import numpy as np

ADAPTATION = Adaptation(
    section=Section.EXTENSIONS,
    targets=(
        Target(
            "verl.experimental.agent_loop.agent_loop",
            "AgentLoopManager.generate_sequences",
            "cbbd9a639567f4636fd4d9a04cd8e13f629206f9615aed90b5bab5f4aa50ef31",
        ),
    ),
    what=(
        "the classic trainer's step hook (`+actor_rollout_ref.rollout.agent.agent_loop_manager_class="
        "verl_mm_tools.step_hook.manager.MMToolAgentLoopManager`): runs `step.process_step` on every generated "
        "batch; calls verl's "
        "`generate_sequences.__wrapped__` (under verl's `auto_await`)"
    ),
    why=("the classic trainer's only channel from rollout to the logger is the manager's `meta_info[\"timing\"]`"),
    applies_to="verl 0.9.1 classic trainer (`trainer.use_v1=false`, deprecated by verl)",
    proof="none (an extension, not a fix)",
)


@ADAPTATION.implements
class MMToolAgentLoopManager(AgentLoopManager):
    def __init__(self, *args: Any, **kwargs: Any) -> None:  # verl's, passed on
        confirm(ADAPTATION)  # the verl method it calls into changed: refuses to start
        super().__init__(*args, **kwargs)

    @functools.cached_property
    def call_rate_watch(self) -> CallRateWatch:  # the tool-call guard's memory of earlier steps
        return CallRateWatch()

    @auto_await  # the trainer calls it synchronously, as it does verl's manager
    async def generate_sequences(self, prompts: DataProto) -> DataProto:
        output = await AgentLoopManager.generate_sequences.__wrapped__(self, prompts)
        metrics = process_step(
            step_batch(output, prompts.meta_info, prompts.non_tensor_batch.get("uid")), self.call_rate_watch
        )
        output.meta_info.setdefault("timing", {}).update(metrics)
        return output


def step_batch(output: DataProto, meta_info: dict, uids: np.ndarray | None = None) -> StepBatch:
    """The classic trainer's generated batch as a StepBatch (``rm_scores`` shared, so turn rewards land in it);
    ``uids``: the prompts' uid column (their rollouts' group), when the trainer gave one."""
    batch, columns = output.batch, output.non_tensor_batch
    extra_keys = [key for key in output.meta_info.get("reward_extra_keys", []) if key in columns]
    return StepBatch(
        columns=columns,
        response_mask=batch["response_mask"],
        rm_scores=batch["rm_scores"] if "rm_scores" in batch.keys() else None,
        rollout_n=_rollout_numbers(columns.get(SampleFields.key("dump")), len(output), uids),
        reward_extra=[{key: columns[key][row] for key in extra_keys} for row in range(len(output))],
        step=int(meta_info.get("global_steps", -1)),
        validate=bool(meta_info.get("validate", False)),
    )


def _rollout_numbers(dumps: Sequence[object] | None, rows: int, uids: np.ndarray | None = None) -> list[int]:
    """verl's own rule (``get_trajectory_info``): consecutive rows of one prompt are its rollouts 0, 1, ... A prompt is
    its uid when every row has one (verl's group, one per prompt), else its sample index, which prompts may share
    (RLHFDataset gives 0 to every row without extra_info.index). ``dumps``: the rows' staged dumps (the hand-off's
    ``dump`` column; None without dump_dir), which name their sample index."""
    if uids is not None and len(uids) == rows:
        keys = list(uids)
    else:
        dumps = dumps if dumps is not None else [None] * rows
        keys = [dump.get("sample_index") if isinstance(dump, dict) else None for dump in dumps]
    numbers, current = [], 0
    for row, key in enumerate(keys):
        current = current + 1 if row and key is not None and key == keys[row - 1] else 0
        numbers.append(current)
    return numbers
