"""The v1 trainer (TransferQueue): each distinct image once per prompt group (issue #59, step 3). verl's
``AgentLoopWorkerTQ._agent_loop_postprocess`` puts a trajectory's samples into TransferQueue, each tensor of each
sample on its own: with ``export: per_turn`` a trajectory of n images stored and read 1 + 2 + ... + n of them, and a
GRPO group of n trajectories its prompt image n times. Fixed: verl's method runs within ``shared_images.putting``
(``agent_loop/shared_images.py``), which knows the put's keys (verl's ``{uid}_{session_id}_{index}``); the sample
inputs' fix (``processed_images.py``) then gives a sample an ``ImageRef`` for each image a sample of its group's puts
showed first. A put may refer to one still in flight, and waits for it; if that one failed (its reward or its put),
nothing carries the images: the referring put's samples are removed from TransferQueue and its trajectory fails
(``ImagesLost``). The trainer's workers read referred images where they are (``compact_images.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import Adaptation, Section, Target
from verl_mm_tools.agent_loop.shared_images import ImagesLost, putting

if TYPE_CHECKING:
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker

POSTPROCESS_SHA256 = "523edacbff73640dee470baf8c1f09fb3450e4095c05d5d2226f9ef706604b5b"
TARGET = Target(
    "verl.trainer.ppo.v1.agent_loop_tq",
    "AgentLoopWorkerTQ.__ray_actor_class__._agent_loop_postprocess",
    POSTPROCESS_SHA256,
)
# the actor class Ray made of it at ``@ray.remote``: its methods are Ray's tracing wrappers, holding the functions the
# class had then, so a method replaced on the class afterwards is not what verl's own actor runs
RAY_ACTOR_TARGET = Target(
    "verl.trainer.ppo.v1.agent_loop_tq",
    "AgentLoopWorkerTQ.__ray_metadata__.modified_class._agent_loop_postprocess",
    POSTPROCESS_SHA256,
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET, RAY_ACTOR_TARGET),
    what="runs verl's put of a trajectory's samples within a `GroupPut` holding their keys (verl's "
    "`{uid}_{session_id}_{index}`, so the sha256 guards the format), on the class and on the actor class Ray made "
    "of it (whose methods hold the functions of the class at `@ray.remote`): each sample refers to an image a "
    "sample of its prompt group's puts showed first (`compact_image.ImageRef`; a prompt video's frames: "
    "`compact_video.VideoRef`), and carries the others; a put "
    "referring to one that failed removes its samples and fails its trajectory",
    why="TransferQueue stores and sends every tensor of every sample on its own: `export: per_turn` carried a "
    "trajectory's images 1 + 2 + ... + n times (4.5x its images at 8 turns), a GRPO group of n its shared images n "
    "times (issue #59, step 3)",
    applies_to="verl 0.9.1 v1 trainer (`trainer.use_v1=true`)",
    proof="`tests/adaptations/test_shared_images_on_cpu.py::"
    "test_verls_put_stores_each_image_of_a_group_once_and_each_sample_reads_back_verls_own_inputs`; that verl's own "
    "actor class runs it: `tests/adaptations/test_shared_images_on_cpu.py::test_verls_own_actor_class_runs_the_fix`",
)


@ADAPTATION.replaces(RAY_ACTOR_TARGET)  # verl's own workers
@ADAPTATION.replaces(TARGET)  # the class, for the subclasses made of it later (``manager_tq``)
async def _agent_loop_postprocess(
    original: Callable[..., Awaitable[None]],
    self: AgentLoopWorker,
    output: AgentLoopOutput | list[AgentLoopOutput],
    validate: bool,
    **kwargs: object,
) -> None:
    import transfer_queue as tq

    outputs = output if isinstance(output, list) else [output]
    partition = "val" if validate else "train"  # verl's partitions
    try:
        async with putting(str(kwargs["uid"]), kwargs["session_id"], partition, outputs):
            await original(self, output, validate, **kwargs)
    except ImagesLost as lost:  # nothing carries some of its images: its samples must not be trained on
        await tq.async_kv_clear(keys=lost.keys, partition_id=lost.partition)
        raise
