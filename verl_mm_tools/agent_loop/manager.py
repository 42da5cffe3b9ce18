"""An AgentLoopManager that logs the mm_tool statistics of every step.

verl 0.9.1's trainer logs only two per-trajectory fields of an agent loop (``__num_turns__`` and
``tool_call_counts``); the one other channel from rollout to the logger is the manager's ``meta_info["timing"]``,
which the trainer logs as ``timing_s/<name>``. Select this manager with
``actor_rollout_ref.rollout.agent.agent_loop_manager_class=verl_mm_tools.agent_loop.manager.MMToolAgentLoopManager``
(classic trainer, ``trainer.use_v1=False``) and the step metrics of ``stats.aggregate_metrics`` appear as
``timing_s/mm_tool/...`` (e.g. ``timing_s/mm_tool/images/mean``, ``timing_s/mm_tool/stop/length_limit``).
"""

from __future__ import annotations

from verl.experimental.agent_loop.agent_loop import AgentLoopManager
from verl.protocol import DataProto
from verl.utils.ray_utils import auto_await

from verl_mm_tools.agent_loop.stats import aggregate_metrics


class MMToolAgentLoopManager(AgentLoopManager):
    @auto_await  # the trainer calls it synchronously, as it does verl's manager
    async def generate_sequences(self, prompts: DataProto) -> DataProto:
        output = await AgentLoopManager.generate_sequences.__wrapped__(self, prompts)
        output.meta_info.setdefault("timing", {}).update(aggregate_metrics(output.non_tensor_batch))
        return output
