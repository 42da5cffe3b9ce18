"""What the warm start's demonstrations look like, per task (``FormatTask``, ``TASKS``), and what a warm start fits
(``WarmStartSpec``): read by the demonstrations (``demo.demonstrations``), the fit (``demo.fit``) and the cache key
(``demo.warm_start``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

from PIL import Image

from verl_mm_tools.data import color, rotation, video, zoom_color
from verl_mm_tools.data.rotation import ANGLES
from verl_mm_tools.errors import ConfigError

TOOL_DEGREES = (90, 180, 270)


class AfterCall(str, Enum):
    """What the answer after a tool's image is fitted to."""

    RANDOM = "random label"  # uninformative, as the direct answers
    # Any of the answers: the loss -log(sum of the answers' probabilities), plus a term that keeps the answers' mean
    # over the batch even (each answer still free to follow the picture)
    EITHER = "either answer, balanced over the batch"
    TRUE = "the true answer"  # a cold start that reads the tool's image


ToolCall = tuple[str, dict]  # a tool's name and its arguments


@dataclass(frozen=True)
class FormatTask:
    """What the demonstrations of a task look like: its question, its answer choices, its pictures and its tool call."""

    question: str
    answers: tuple[str, ...]
    pictures: Callable[[int, int], list[tuple[Image.Image, str]]]  # (count, seed) -> (picture, true answer)
    calls: tuple[ToolCall, ...] = tuple(("rotate", {"degrees": degrees}) for degrees in TOOL_DEGREES)  # one drawn
    # The share of demonstrations that answer at once, without a call (the same share of each true answer's)
    direct_share: float = 0.0
    # Another task whose demonstrations join these with their TRUE answers. Fitted to a format that never depends on
    # the picture, the tiny model stops attending to its pictures and then cannot learn to read them (measured in
    # docs/experiments/learn_zoom.md); real VLMs come pretrained to look, and this keeps the tiny one looking.
    sight: str | None = None
    # What the answer after a tool's image is fitted to. Random labels there teach the answer after a tool's image to
    # ignore that image, and RL then had to undo it: reading the zoomed box started in some runs and not in others;
    # with EITHER but without its balance term one seed's answer after a call leaned 80 % to one answer and never
    # read (docs/experiments/learn_zoom.md). Left out of the loss entirely, the tiny model wrote no answer there.
    after_call: AfterCall = AfterCall.RANDOM
    # The loss weight of the true answer after a call (AfterCall.TRUE) against each other labelled token's 1: it is
    # one token of the ~60 a calling demonstration labels. Weighted 1, the zoom_read fit read the zoomed box after
    # 600 steps (p(true answer) 0.97) and not after 300 (0.50); weighted 10, not after 200; weighted 30, after 200
    # on seeds 0, 1 and 2 (0.996-1.0).
    after_call_weight: float = 1.0
    # Steps of a first fit on the calling demonstrations' answers alone (answer tokens only, lr READING_LR), before
    # the format fit: the premise's fit (``demo.premise``), which reads the zoomed box from the untrained model within
    # 100 steps. Without it, whether the format fit ever read depended on the seed (seed 1 at 450 steps: p(true
    # answer) 0.50 after a zoom; seeds 0 and 2: 1.00).
    reading_steps: int = 0
    # The demonstrations' prompts are the video task's clips (``demo.video_demonstrations``), not ``pictures``
    video: bool = False
    # The warm start fails, uncached, unless its ``fit_check.ColdStartCheck`` finds nothing that keeps RL from
    # learning (every warm start reports the check)
    checked: bool = False

    def __post_init__(self) -> None:
        if not self.calls and self.direct_share != 1.0:
            raise ConfigError(
                f"a format task without tool calls answers at once: direct_share must be 1.0, got {self.direct_share}"
            )


TASKS = {
    "rotation": FormatTask(
        rotation.QUESTION,
        tuple(str(angle) for angle in ANGLES),
        lambda count, seed: [(sample.image, str(sample.angle)) for sample in rotation.rotation_samples(count, seed)],
    ),
    # Answers at once (the rotate tool is still offered). With a rotate call first, the call itself flipped on and
    # off between steps at the learning rates that teach the answer (measured with verl's trainer, labels drawn
    # independently then: calls per trajectory 1.0 -> 0.0 within 17 steps at 3e-3, no learning in 35 at 1e-3).
    "color": FormatTask(
        color.QUESTION,
        tuple(color.COLORS),
        lambda count, seed: [(sample.image, sample.label) for sample in color.color_samples(count, seed)],
        calls=(),
        direct_share=1.0,
    ),
    # Half answer at once, half zoom in on the centre box first: the first policy calls about half the time, and
    # nothing tells it when calling pays.
    "zoom_color": FormatTask(
        zoom_color.QUESTION,
        tuple(zoom_color.PATTERNS),
        lambda count, seed: [(sample.image, sample.label) for sample in zoom_color.zoom_color_samples(count, seed)],
        calls=(("zoom_in", zoom_color.BOX_ARGUMENTS),),
        direct_share=0.5,
        sight="color",
        after_call=AfterCall.EITHER,
    ),
}
# The main job's cold start: as zoom_color, but the answer after the zoom is the true one. It reads the zoomed box
# and still calls in half its first turns: RL learns when calling pays. No sight pictures: the true answers after a
# zoom keep it looking at its pictures, and a step without them costs about a third less.
TASKS["zoom_read"] = replace(
    TASKS["zoom_color"], sight=None, after_call=AfterCall.TRUE, after_call_weight=30.0, reading_steps=100
)
# The video task's cold start, as zoom_read's: get_frames over the flash in half its first turns and the true colour
# after it; answers at once (at chance: the prompt's frames miss the flash) in the other half.
TASKS["video_read"] = replace(
    TASKS["zoom_read"],
    question=video.PROMPT.removeprefix("<video>").format(at=video.DEMO_FLASH_FRAME / video.FPS),
    answers=tuple(sorted(video.COLORS)),
    pictures=lambda count, seed: [],
    calls=(("get_frames", video.DEMO_CALL),),
    video=True,
    checked=True,
)
# The same answers after a rotate call by 90 degrees: every trajectory holds a tool call and the tool's image.
TASKS["color_tool"] = replace(TASKS["color"], calls=(("rotate", {"degrees": 90}),), direct_share=0.0)


@dataclass(frozen=True)
class WarmStartSpec:
    task: str = "rotation"
    demonstrations: int = 64
    steps: int = 200
    # Batches of 4 ~500-token sequences run ~20x faster per sequence on CPU than batches of 8 (measured).
    batch_size: int = 4
    lr: float = 1e-2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"unknown warm-start task {self.task!r}; choose one of {sorted(TASKS)}")
