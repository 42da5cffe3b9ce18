"""verl's fully async trainer assembles each step's batch from the rollouter's samples
(``detach_utils.assemble_batch_from_rollout_samples``) and computes its partial-rollout metrics from every
trajectory's ``min_global_steps`` and ``max_global_steps`` (``abs(a - b)``; then ``current_param_version - v``). A
trajectory masked before it generated (the mm_tool loop masks one whose browser failed to launch) has None there: the
step failed with a TypeError and the run ended. Fixed: such a trajectory gets the oldest version of the step's other
trajectories (``handoff.fill_missing_weight_versions``, as the v1 trainer's step hook does), or 0 where none
generated (then the masked-batch guard stops the step with its reason); the count goes to the batch's
``meta_info`` under ``mm_tool/unversioned_samples``, which the step hook logs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target
from verl_mm_tools.handoff import fill_missing_weight_versions
from verl_mm_tools.step_metrics import UNVERSIONED_SAMPLES

VERSION_KEYS = ("min_global_steps", "max_global_steps")
NO_VERSION_GENERATED = 0  # the fallback where no trajectory of the step generated: the initial weights'
TARGET = Target(
    "verl.experimental.fully_async_policy.detach_utils",
    "assemble_batch_from_rollout_samples",
    "9f662514e41b25b41da712bedfdecd8092329db10b938b198962bafcb83f5ee4",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="a trajectory without weight versions (masked before it generated) gets the oldest version of the step's "
    "other trajectories before verl assembles the batch; the count goes to `meta_info` (`mm_tool/unversioned_samples`)",
    why="verl computes partial-rollout metrics from every trajectory's `min_global_steps`/`max_global_steps` and "
    "failed on None: a browser that failed to launch ended a fully async run",
    applies_to=f"{VERL} fully async trainer",
    proof="`tests/adaptations/test_verl_fixes_on_cpu.py::"
    "test_verls_fully_async_assembly_fails_on_a_sample_without_versions_and_the_fix_fills_them`",
)


@ADAPTATION.replaces(TARGET)
def assemble_with_versions(
    assemble: Callable[..., Any], rollout_samples: Sequence[Any], *args: Any, **kwargs: Any
) -> Any:
    """verl's assembly, after filling the missing weight versions of ``rollout_samples`` (verl's ``RolloutSample``:
    one prompt's trajectories each, in ``full_batch.non_tensor_batch``)."""
    places = [
        (sample.full_batch.non_tensor_batch, row) for sample in rollout_samples for row in range(len(sample.full_batch))
    ]
    tags = [{key: columns[key][row] for key in VERSION_KEYS} for columns, row in places]
    filled = fill_missing_weight_versions(tags, fallback=NO_VERSION_GENERATED)
    if filled:  # verl's own columns are written only where a version was missing
        for (columns, row), tag in zip(places, tags, strict=True):
            for key in VERSION_KEYS:
                columns[key][row] = tag[key]
    batch = assemble(rollout_samples, *args, **kwargs)
    batch.meta_info[UNVERSIONED_SAMPLES] = float(filled)
    return batch
