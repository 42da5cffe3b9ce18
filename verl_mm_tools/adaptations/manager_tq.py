"""verl's v1 agent-loop manager with the fix mm_tool's multi-sample export needs (``export`` per_turn / auto).

verl 0.9.1's ``AgentLoopWorkerTQ`` scores a trajectory that returns several outputs by stacking every output's
position ids with ``pad_sequence``, which pads along the first dimension. For M-RoPE models (every Qwen-VL) a sample's
position ids are (4, L), so samples of different lengths crash the reward step ("The size of tensor a (450) must
match the size of tensor b (519)"), and the whole prompt group fails. Reward managers score the final sample only
(verl's naive and DAPO managers and ours read ``data[-1:]``; verl then copies the score to the earlier samples), so
this worker scores the final sample alone. Select it (the mm_tool loop asks for it when it exports several samples)::

    +actor_rollout_ref.rollout.agent.agent_loop_manager_class=verl_mm_tools.adaptations.manager_tq.MMToolAgentLoopManagerTQ
"""

from __future__ import annotations

import ray
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ


def final_sample_scoring_worker():
    """The Ray actor class of verl's v1 worker scoring a trajectory's final sample alone. Built in a function: a
    module-level subclass of a ``@ray.remote`` class is pickled by reference while its base travels by value, and the
    base's own ``super()`` then fails in the actor ("obj must be an instance or subtype of type")."""

    class FinalSampleScoringWorker(AgentLoopWorkerTQ.__ray_actor_class__):
        async def _compute_score(self, outputs, kwargs):
            await super()._compute_score(outputs[-1:], kwargs=kwargs)

    return ray.remote(FinalSampleScoringWorker)


class MMToolAgentLoopManagerTQ(AgentLoopManagerTQ):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)  # sets verl's worker class; the workers start later, in create()
        self.agent_loop_workers_class = final_sample_scoring_worker()
