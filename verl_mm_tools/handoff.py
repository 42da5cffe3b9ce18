"""What the mm_tool loop hands the trainer with each training sample, as one typed record: ``SampleFields``.

verl carries it as the sample's ``extra_fields``, one key per field: ``mm_tool/<field>``, and for three fields the key
verl or the reward managers read (``tool_call_counts``, ``attempts``, ``last_assistant_text``). Every sample has every
key, since verl concatenates each key across workers into one column of the batch (rows of other agent loops read
None there). The loop writes the record (``agent_loop/state.py``); the step hooks, eval's report, the dumps and the
step metrics (``step_metrics``) read it back by field (``SampleFields.of_row``). A new statistic is a new field.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verl_mm_tools.judge.context import JudgeContext

logger = logging.getLogger(__name__)

PREFIX = "mm_tool/"

# verl's own column (its compute_data_metrics logs tool_call_counts/{min,max,mean}) and the two keys the reward
# managers read (``rewards.common`` documents them for reward functions)
TOOL_CALLS_KEY = "tool_call_counts"
ATTEMPTS_KEY = "attempts"
LAST_ASSISTANT_TEXT_KEY = "last_assistant_text"
_KEY = "extra_field_key"  # a field's metadata entry naming a key other than mm_tool/<field>


class StopReason(str, Enum):
    """Why a trajectory ended."""

    ANSWERED = "answered"  # the model answered without a tool call (and any environment was done with it)
    TURN_LIMIT = "turn_limit"  # it still wanted to act at max_assistant_turns / max_user_turns
    LENGTH_LIMIT = "length_limit"  # the response budget is used up (a turn that did not fit was dropped)
    BUDGET = "budget"  # an image did not fit the image budget with over_budget=stop
    # a tool's failed call ended it (its metrics' END_TRAJECTORY: the python tool's on_error: end), after that call's
    # answer; trained as usual
    TOOL_FAILED = "tool_failed"
    # a tool's call ended its environment's episode (its metrics' EPISODE_DONE: a GUI task done or failed), after that
    # call's answer; trained as usual
    EPISODE_DONE = "episode_done"
    ERROR = "error"  # masked: trained on nothing (mm_tool/error says why)


@dataclass
class ToolStats:
    """One tool's calls in a trajectory (as a dict in ``SampleFields.per_tool``), or summed over a step."""

    calls: int = 0
    errors: int = 0
    time_s: float = 0.0
    remote_calls: int = 0  # answered by a Ray actor pool (``remote:``)


@dataclass(frozen=True)
class LoopSettings:
    """The loop's options the trainer-side step hook acts on, carried by each sample."""

    max_masked_fraction: float  # the masked-batch guard's limit
    call_rate_window: int  # the tool-use collapse guard's window (0: off)
    turn_credit: bool  # whether the step hook places turn rewards (mm_turn_grpo)
    turn_gamma: float  # algorithm.gamma: the per-turn discount, for chaining a trajectory's samples


@dataclass(frozen=True)
class SampleFields(LoopSettings):
    """One training sample's fields. The trajectory's statistics are the same on each of its samples and counted
    once, on its final one (``is_final``)."""

    # what the model did
    tool_call_counts: int = field(metadata={_KEY: TOOL_CALLS_KEY})
    attempts: int = field(metadata={_KEY: ATTEMPTS_KEY})  # answers given (>= 1), for mm_turn_discount
    last_assistant_text: str = field(metadata={_KEY: LAST_ASSISTANT_TEXT_KEY})
    turns: int  # assistant turns (generations) in the output: the one turn count of logs and viewer
    tool_calls: int
    tool_errors: int
    tool_time_s: float
    valid_actions: int
    invalid_actions: int
    ignored_calls: int
    per_tool: dict[str, dict[str, float]]  # tool name -> its ToolStats' fields
    env_infos: list[dict[str, Any]]  # what the environment reported, per environment turn (JSON)
    # how it ended
    stop_reason: str  # a StopReason's value
    masked: int  # 1: trained on nothing (``error`` says why)
    error: str
    dropped_turns: int
    # images
    images: int
    image_tokens: int
    budget_refusals: int
    budget_downscales: int
    processor_runs: int  # images the HF image processor processed in the rollout
    float_images: int  # images kept as float pixel values: their family has no compact form
    # the engine: seconds awaiting it; from the second generation on, the prompt tokens sent and those its prefix
    # cache held (0 and 0 where it does not report them)
    generate_s: float
    later_prompt_tokens: int
    later_cached_tokens: int
    # weight versions (verl's fully async trainer): [first, last] over the generations (None where the engine
    # reports none), generations a weight sync interrupted and verl's client resumed, those aborted without a resume
    # (the trajectory is masked), and what the resumes cost: requests after a generation's first, the prompt tokens
    # prefilled again and the images sent (and encoded) again
    weight_versions: list[int] | None
    resumed_generations: int
    aborted_generations: int
    resumes: int
    resume_prefill_tokens: int
    resume_images: int
    request_id: str  # verl's request id of the trajectory: what its server calls were sent as
    # this sample: [index, count] among its trajectory's samples (export per_turn / auto), its turns' rewards and
    # their response spans in it
    sample: list[int]
    turn_rewards: list[float]
    turn_spans: list[list[int]] | None
    # the bytes of image inputs it carries to the trainer (compact forms, or float pixel values for a family without
    # one), and on the trajectory's final sample its distinct images by content digest, each with its raw bytes (3
    # per pixel; empty on its other samples): the step metric counts an image shown by several trajectories once
    image_bytes: int
    distinct_images: dict[str, int]
    dump: dict[str, Any] | None = None  # the trajectory's staged dump (final sample, with dump_dir), not a statistic
    # what a judge sees besides the answer (final sample, with the judge_images option): for the reward worker; the
    # step hook drops it from the batch before training
    judge_context: JudgeContext | None = None

    @property
    def is_final(self) -> bool:
        return self.sample[0] == self.sample[1] - 1

    def extra_fields(self) -> dict[str, Any]:
        return {key: getattr(self, name) for name, key in _KEYS.items()}

    @classmethod
    def key(cls, name: str) -> str:
        """The extra field's key of field ``name``."""
        return _KEYS[name]

    @classmethod
    def of_row(cls, columns: Mapping[str, Sequence[Any]], row: int) -> SampleFields | None:
        """Row ``row`` of a batch's columns; None for a row of another agent loop. A KeyError names a key the columns
        lack (records of an older version)."""
        stop = columns.get(_KEYS["stop_reason"])
        if stop is None or stop[row] is None:
            return None
        return cls(
            **{name: columns[key][row] for name, key in _KEYS.items() if name not in _OPTIONAL or key in columns}
        )

    @classmethod
    def rows(cls, columns: Mapping[str, Sequence[Any]], count: int) -> list[SampleFields | None]:
        return [cls.of_row(columns, row) for row in range(count)]

    @classmethod
    def every_row(cls, columns: Mapping[str, Sequence[Any]]) -> list[SampleFields]:
        """Each row's fields, of a batch whose rows the mm_tool loop wrote, every one (eval's, a test's)."""
        rows = cls.rows(columns, len(columns.get(_KEYS["stop_reason"], ())))
        ours = [fields for fields in rows if fields is not None]
        if not ours or len(ours) < len(rows):
            raise ValueError(f"{len(rows) - len(ours)} of the batch's {len(rows)} rows are not the mm_tool loop's")
        return ours


_OPTIONAL = ("dump", "judge_context")  # fields a batch may lack (records and batches of older versions)
_KEYS = {item.name: item.metadata.get(_KEY, PREFIX + item.name) for item in dataclasses.fields(SampleFields)}


def fill_missing_weight_versions(tags: Sequence[dict], fallback: int) -> int:
    """Give each sample's tag (verl's ``min_global_steps`` and ``max_global_steps``) without weight versions, a
    trajectory masked before it generated (a browser that failed to launch), the oldest version the other samples ran
    under, or ``fallback`` where none did; return how many. verl's trainers read both as ints (their staleness metrics)
    and failed on None; such a sample trains no token, and the oldest version keeps the batch's reported staleness
    from shrinking."""
    missing = [tag for tag in tags if tag.get("min_global_steps") is None or tag.get("max_global_steps") is None]
    known = [tag["min_global_steps"] for tag in tags if tag.get("min_global_steps") is not None]
    oldest = min(known, default=fallback)
    for tag in missing:
        tag["min_global_steps"] = tag["max_global_steps"] = oldest
    if missing:
        logger.warning("mm_tool: %d sample(s) masked before generating given weight version %d", len(missing), oldest)
    return len(missing)
