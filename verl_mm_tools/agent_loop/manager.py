"""An AgentLoopManager that logs the mm_tool statistics of every step and places per-turn rewards.

verl 0.9.1's trainer logs only two per-trajectory fields of an agent loop (``__num_turns__`` and
``tool_call_counts``); the one other channel from rollout to the logger is the manager's ``meta_info["timing"]``,
which the trainer logs as ``timing_s/<name>``. Select this manager with
``actor_rollout_ref.rollout.agent.agent_loop_manager_class=verl_mm_tools.agent_loop.manager.MMToolAgentLoopManager``
(classic trainer, ``trainer.use_v1=False``) and the step metrics of ``stats.aggregate_metrics`` appear as
``timing_s/mm_tool/...`` (e.g. ``timing_s/mm_tool/images/mean``, ``timing_s/mm_tool/stop/length_limit``).

With ``algorithm.adv_estimator=mm_turn_grpo`` it also adds each trajectory's per-turn rewards
(``mm_tool/turn_rewards``: tool step rewards + environment rewards) to ``rm_scores`` on the last token of each
assistant turn, where the estimator credits them (``verl_mm_tools.rewards.turn_credit``).

When the mm_tool loop dumps trajectories (its ``dump_dir`` option), it publishes each step's dumps with the step and
rewards and enforces their caps (``verl_mm_tools.agent_loop.dump``).
"""

from __future__ import annotations

import logging

from verl.experimental.agent_loop.agent_loop import AgentLoopManager
from verl.protocol import DataProto
from verl.utils.ray_utils import auto_await

from verl_mm_tools.agent_loop.dump import finalize_step_dumps
from verl_mm_tools.agent_loop.stats import PREFIX, aggregate_metrics
from verl_mm_tools.rewards.turn_credit import ESTIMATOR_NAME, place_turn_rewards

logger = logging.getLogger(__name__)


class MMToolAgentLoopManager(AgentLoopManager):
    @auto_await  # the trainer calls it synchronously, as it does verl's manager
    async def generate_sequences(self, prompts: DataProto) -> DataProto:
        output = await AgentLoopManager.generate_sequences.__wrapped__(self, prompts)
        metrics = aggregate_metrics(output.non_tensor_batch)
        metrics.update(finalize_step_dumps(output, prompts.meta_info))  # before turn rewards are placed in rm_scores
        if self._turn_credit_enabled():
            metrics[PREFIX + "turn_rewards/unplaced"] = float(self._place_turn_rewards(output))
        output.meta_info.setdefault("timing", {}).update(metrics)
        return output

    def _turn_credit_enabled(self) -> bool:
        algorithm = getattr(self, "config", None) and self.config.get("algorithm")
        return bool(algorithm) and algorithm.get("adv_estimator") == ESTIMATOR_NAME

    @staticmethod
    def _place_turn_rewards(output: DataProto) -> int:
        turn_rewards = output.non_tensor_batch.get(PREFIX + "turn_rewards")
        if turn_rewards is None:
            return 0
        if "rm_scores" not in output.batch.keys():
            logger.warning("mm_turn_grpo: no rm_scores after rollout (reward not streamed); per-turn rewards unplaced")
            return len(turn_rewards)
        skipped = place_turn_rewards(output.batch["rm_scores"], output.batch["response_mask"], turn_rewards)
        if skipped:
            logger.warning("mm_turn_grpo: %d trajectories' turn counts did not match their turn rewards", skipped)
        return skipped
