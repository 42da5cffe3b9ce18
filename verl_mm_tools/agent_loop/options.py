"""The values of the mm_tool loop's choice options, in one place: the loop's config, the CLI and the docs' options
table read them from here. Light (no verl import), so the CLI's parser can use them.

Each is a ``str`` enum: a member equals its YAML string (``Export.PER_TURN == "per_turn"``) and prints as it.
"""

from __future__ import annotations

from enum import Enum

from verl_mm_tools.errors import ConfigError, did_you_mean


class Choice(str, Enum):
    """An option's values; ``parse`` turns a YAML string into a member or a ConfigError naming the valid ones."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)

    @classmethod
    def parse(cls, option: str, value: object) -> Choice:
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(
                f"mm_tool {option} must be one of {cls.values()}, got {value!r}."
                + did_you_mean(str(value), cls.values())
            ) from None


class Export(Choice):
    """How a trajectory becomes training samples (``verl_mm_tools.agent_loop.export``)."""

    PER_TRAJECTORY = "per_trajectory"
    PER_TURN = "per_turn"
    AUTO = "auto"


class ToolPrompt(Choice):
    """Where the tool schemas reach the model (``verl_mm_tools.agent_loop.tool_format``)."""

    AUTO = "auto"
    TEMPLATE = "template"
    SYSTEM = "system"
    OFF = "off"


class ToolResponseRole(Choice):
    """Which role carries tool results (``verl_mm_tools.agent_loop.tool_format``)."""

    AUTO = "auto"
    TOOL = "tool"
    USER = "user"
    SPLIT = "split"  # tool messages with the results' text, their images in a user turn after them


class OverBudget(Choice):
    """What happens to a tool image that does not fit the image token budget (``verl_mm_tools.agent_loop.budget``)."""

    DOWNSCALE = "downscale"
    REFUSE = "refuse"
    STOP = "stop"
