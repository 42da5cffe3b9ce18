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

from typing import TYPE_CHECKING

import ray
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from verl_mm_tools.adaptations.guard import verified
from verl_mm_tools.adaptations.record import Adaptation, Section, Target

if TYPE_CHECKING:
    from ray.actor import ActorClass
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker

ADAPTATION = Adaptation(
    section=Section.SUBCLASS_FIXES,
    targets=(
        Target(
            "verl.experimental.agent_loop.agent_loop",
            "AgentLoopWorker._compute_score",
            "cf4b57719ad3c1b236e49fb99dddc4f6cf05bc0fb125e1475ce5c2534af2b742",
        ),
        Target(
            "verl.trainer.ppo.v1.agent_loop_tq",
            "AgentLoopWorkerTQ.__ray_actor_class__._agent_loop_postprocess",
            "523edacbff73640dee470baf8c1f09fb3450e4095c05d5d2226f9ef706604b5b",
        ),
    ),
    what="scores a trajectory's final sample alone: its workers are `AgentLoopWorkerTQ` with `_compute_score` "
    "overridden. Selected with `+actor_rollout_ref.rollout.agent.agent_loop_manager_class=verl_mm_tools."
    "adaptations.manager_tq.MMToolAgentLoopManagerTQ` (`agent_loop/hook_config.py`: `MANAGER_TQ_OVERRIDE`; the "
    "demo and the bench add it; the mm_tool loop refuses several samples per trajectory without it)",
    why="verl stacks every sample's position ids with `pad_sequence`; Qwen-VL's (4, L) ids of different lengths crash "
    "the reward step and the prompt group fails. Reward managers read only the final sample, and verl copies its "
    "score to the others. (With several samples, verl also right-pads each prompt + response as one sequence, so a "
    "manager's `attention_mask[-response_length:]` counts the longest response for every sample: DAPO's overlong "
    "penalty read 21 tokens for a 9-token final sample; `verl-mm-tools rescore` hands the final sample alone for the "
    "same reason)",
    applies_to="verl 0.9.1 v1 trainer (`trainer.use_v1=true`)",
    proof="`tests/adaptations/test_manager_tq_on_cpu.py::"
    "test_verls_own_worker_fails_to_score_samples_of_different_lengths`",
)


def final_sample_scoring_worker() -> ActorClass[AgentLoopWorker]:
    """The Ray actor class of verl's v1 worker scoring a trajectory's final sample alone. Built in a function: a
    module-level subclass of a ``@ray.remote`` class is pickled by reference while its base travels by value, and the
    base's own ``super()`` then fails in the actor ("obj must be an instance or subtype of type")."""

    # the @ray.remote class's own class, an attribute Ray adds (so unknown to mypy)
    class FinalSampleScoringWorker(AgentLoopWorkerTQ.__ray_actor_class__):  # type: ignore[name-defined, unused-ignore]
        async def _compute_score(self, outputs: list[AgentLoopOutput], kwargs: dict[str, object]) -> None:
            await super()._compute_score(outputs[-1:], kwargs=kwargs)

    return ray.remote(FinalSampleScoringWorker)


@ADAPTATION.implements
class MMToolAgentLoopManagerTQ(AgentLoopManagerTQ):
    def __init__(self, *args: object, **kwargs: object) -> None:
        unchanged = verified(ADAPTATION)  # changed: refuses to start, or (downgraded) False: verl's workers
        super().__init__(*args, **kwargs)  # sets verl's worker class; the workers start later, in create()
        if unchanged:
            self.agent_loop_workers_class = final_sample_scoring_worker()
