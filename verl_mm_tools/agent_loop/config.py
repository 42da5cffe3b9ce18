"""The mm_tool loop's options, parsed once into a frozen dataclass.

Options come from verl's ``agent_loop_config_path`` YAML (extra keys of the ``mm_tool`` entry become constructor
kwargs). Every option has a default, so ``default_agent_loop=mm_tool`` alone works.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from verl_mm_tools.agent_loop.options import Choice, Export, OverBudget, ToolPrompt, ToolResponseRole
from verl_mm_tools.errors import ConfigError, did_you_mean
from verl_mm_tools.files import FileRoots
from verl_mm_tools.judge.context import ImageChoice

DEFAULT_MAX_IMAGES = 16
# the options whose values are a ``Choice``: ``verl_mm_tools.agent_loop.options``
CHOICES: dict[str, type[Choice]] = {
    "over_budget": OverBudget,
    "tool_prompt": ToolPrompt,
    "tool_response_role": ToolResponseRole,
    "export": Export,
}


@dataclass(frozen=True)
class MMToolLoopConfig:
    """Options of the ``mm_tool`` loop (all optional).

    Attributes:
        max_images: Most images in one trajectory, prompt images included. Default: the rollout's
            ``limit_images`` when set, else 16. Must not exceed ``limit_images`` (vLLM's ``limit_mm_per_prompt``).
        min_pixels: Smallest area of a tool image after resizing. Default: the processor's ``min_pixels``.
        max_pixels: Largest area of a tool image after resizing. Default: the processor's ``max_pixels``.
        max_image_tokens: Most image placeholder tokens in one trajectory, prompt images included (None: no cap
            beyond ``max_images`` x per-image maximum).
        over_budget: What happens to a tool image that does not fit ``max_image_tokens``: ``downscale`` it to the
            tokens left (refuse when even the smallest size does not fit), ``refuse`` it (the model gets a text
            response saying the budget is exhausted), or ``stop`` the trajectory (stop reason ``budget``).
        tool_timeout_s: Seconds a single tool call may take; it is then cancelled and the model told.
        annotate_image_ids: Prefix each tool response with the ids of the images it added ("Image 3: ...") when
            the tool's own text does not already name them.
        env: The environment of every trajectory whose sample names none in ``extra_info.env``: a registered name
            or ``{"name": ..., <kwargs>}`` (see ``verl_mm_tools.envs``). None: no environment turns.
        dump_dir: Directory to dump trajectories to, for ``verl-mm-tools view`` (None: no dumps). Needs the
            trainer-side step hook (``step``: the replay buffer on verl's v1 trainer, the agent-loop manager on the
            classic one), which adds the step and rewards and enforces the caps. Relative paths resolve
            against the rollout worker's working directory; on several nodes, use a file system shared with the
            driver. Layout and record keys: ``verl_mm_tools.agent_loop.dump``.
        dump_max_per_step: Most trajectories dumped per step (the first ones of the batch, so GRPO groups stay
            whole); the others are deleted and counted as skipped.
        dump_max_mb: Most megabytes (MiB) the dump directory may hold; once reached, dumping stops for the rest of
            the run (a ``_FULL`` file is written; delete it after freeing space to resume).
        file_roots: Absolute directories that dataset image paths (and tools or environments reading files, see
            ``verl_mm_tools.files``) may be read from; a path resolving outside them (``..``, symlinks) and any URL
            is refused, masking its sample. None: no file is read (images stored as bytes need none).
        max_masked_fraction: Most of a batch's mm_tool trajectories that may be masked (trained on nothing) before
            the run stops with the most common error (the step hook checks it). 0.5: a few bad rows (an unreadable
            image, an oversized prompt) cost only their own samples, while a broken config or dataset, which masks
            (nearly) every trajectory, stops at its first step instead of training on nothing; 1 disables the check.
        call_rate_window: Steps over which the tool-call guard looks back: when the share of a training step's
            trajectories that call a tool (``mm_tool/tool_call_rate``) falls below half its highest value of the
            previous ``call_rate_window`` steps, the trainer log gets a warning (tool-use collapse: the policy is
            dropping its tools) and ``mm_tool/tool_call_rate/collapsed`` is 1 for that step. 0 disables it.
        tool_prompt: Where the tool schemas reach the model: ``template`` (passed to the chat template), ``system``
            (the hermes tool block appended to the system message), ``off`` (the dataset's prompt describes the
            tools), ``auto`` (``template`` when the chat template renders tools, else ``system``; the official
            Qwen2-VL / Qwen2.5-VL templates ignore them). A configured tool whose name the first prompt lacks is a
            ConfigError. See ``verl_mm_tools.agent_loop.tool_format``.
        tool_response_role: How tool results are rendered: ``tool`` messages, ``user`` turns of
            ``<tool_response>`` blocks (text and images), or ``split`` (the text in tool messages, the images in a
            user turn after them); ``auto``: ``tool`` when the template has its own tool-role convention and renders
            images in tool messages (Qwen3-VL, GLM-V), ``split`` when it has one but drops those images (Gemma 4),
            else ``user`` (Qwen2-VL / Qwen2.5-VL would render a bare ``tool`` role).
        export: How a trajectory becomes training samples: ``per_trajectory`` (one sample, the conversation as
            generated), ``per_turn`` (one sample per assistant turn, its prompt the chat template's render of the
            conversation, as at inference), ``auto`` (one sample while the template's render stays an extension of
            it, a new one where it does not). per_turn and auto need verl's v1 trainer. See
            ``verl_mm_tools.agent_loop.export``.
        keep_last_images: Keep only the trajectory's last K images in the model's context: each earlier one is
            rendered as a short note naming its id (``verl_mm_tools.image_window``) and stays in the workspace, so
            tools still take it by id. The budget (``max_images``, ``max_image_tokens``) then bounds the images in
            context. Each training sample is the context the model saw, so it needs several samples per trajectory:
            left unset, ``export`` becomes ``auto`` (a new sample exactly where an image leaves the context);
            ``export: per_trajectory`` is refused. The first prompt is rendered whole. None: every image stays.
        judge_images: What a judge reward (``rewards.judge``) sees besides the final answer: the question and every
            prompt image, plus the tool images chosen here: ``all``, ``none``, ``named`` (those the final answer
            names, "Image 3") or ``last:N``. Each travels as PNG bytes to the reward worker; the step hook drops them
            before training. None: nothing is handed over (a judge reward then refuses to run).
    """

    max_images: int = DEFAULT_MAX_IMAGES
    min_pixels: int | None = None
    max_pixels: int | None = None
    max_image_tokens: int | None = None
    over_budget: OverBudget = OverBudget.DOWNSCALE
    tool_timeout_s: float = 60.0
    annotate_image_ids: bool = True
    env: str | dict | None = None
    dump_dir: str | None = None
    dump_max_per_step: int = 16
    dump_max_mb: float = 512.0
    file_roots: tuple[str, ...] | str | None = None
    max_masked_fraction: float = 0.5
    call_rate_window: int = 10
    tool_prompt: ToolPrompt = ToolPrompt.AUTO
    tool_response_role: ToolResponseRole = ToolResponseRole.AUTO
    export: Export = Export.PER_TRAJECTORY
    keep_last_images: int | None = None
    judge_images: str | None = None

    @classmethod
    def from_options(cls, options: dict[str, Any], *, limit_images: int | None) -> MMToolLoopConfig:
        """Parse the loop's YAML options, checked against verl's rollout ``limit_images``."""
        names = {field.name for field in dataclasses.fields(cls)}
        for key in options:
            if key not in names:
                raise ConfigError(
                    f"unknown mm_tool option {key!r}; valid options are {sorted(names)}." + did_you_mean(key, names)
                )
        values = {key: value for key, value in options.items() if value is not None}
        if "max_images" not in values and limit_images is not None:
            values["max_images"] = int(limit_images)
        if values.get("keep_last_images") is not None and "export" not in values:
            values["export"] = Export.AUTO  # a window needs several samples (the per_trajectory stream only grows)
        config = cls(**values)
        config.check_against_server(limit_images)
        return config

    def __post_init__(self) -> None:
        _require_positive_int("max_images", self.max_images)
        for name in ("min_pixels", "max_pixels", "max_image_tokens", "keep_last_images"):
            if getattr(self, name) is not None:
                _require_positive_int(name, getattr(self, name))
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise ConfigError(f"mm_tool min_pixels ({self.min_pixels}) must be <= max_pixels ({self.max_pixels})")
        for name, choice in CHOICES.items():  # the YAML's strings become members
            object.__setattr__(self, name, choice.parse(name, getattr(self, name)))
        if self.keep_last_images is not None and self.export is Export.PER_TRAJECTORY:
            raise ConfigError(
                f"mm_tool keep_last_images={self.keep_last_images} with export=per_trajectory: one sample is the "
                "conversation as generated, which only grows, so it cannot be the context the model saw once an "
                "image leaves it. Set export to auto (the default with keep_last_images) or per_turn."
            )
        timeout = self.tool_timeout_s
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ConfigError(f"mm_tool tool_timeout_s must be a positive number of seconds, got {timeout!r}")
        _require_positive_int("dump_max_per_step", self.dump_max_per_step)
        _require_positive_number("dump_max_mb", self.dump_max_mb)
        if self.dump_dir is not None and (not isinstance(self.dump_dir, str) or not self.dump_dir.strip()):
            raise ConfigError(f"mm_tool dump_dir must be a directory path or null, got {self.dump_dir!r}")
        fraction = self.max_masked_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
            raise ConfigError(f"mm_tool max_masked_fraction must be a number in [0, 1], got {fraction!r}")
        window = self.call_rate_window
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ConfigError(f"mm_tool call_rate_window must be a whole number of steps >= 0 (0: off), got {window!r}")
        if self.judge_images is not None:
            ImageChoice.parse(self.judge_images)
        FileRoots.from_config(self.file_roots)  # relative or missing directories are ConfigErrors now, not later

    def check_against_server(self, limit_images: int | None) -> None:
        """Refuse a budget that lets the loop send more images than the inference server accepts."""
        if limit_images is not None and self.max_images > limit_images:
            raise ConfigError(
                f"mm_tool max_images={self.max_images} exceeds actor_rollout_ref.rollout.limit_images={limit_images} "
                f"(the inference server's limit_mm_per_prompt): a trajectory could be rejected by the server. Set "
                f"max_images <= {limit_images} in the mm_tool agent-loop config, or raise rollout.limit_images."
            )


def _require_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"mm_tool {name} must be a positive integer, got {value!r}")


def _require_positive_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"mm_tool {name} must be a positive number, got {value!r}")
