"""One small error hierarchy. Messages say what was wrong, what was received and what to do."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class VerlMMToolsError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(VerlMMToolsError, ValueError):
    """A user configuration (YAML, hydra override, dataset column) is invalid."""


class ColdStartError(ConfigError):
    """A cold start ended without what RL needs from it (a parseable call, reading the tool's answer)."""


class PluginRegistrationError(VerlMMToolsError, RuntimeError):
    """Registering a component into one of verl's registries failed (e.g. a name clash)."""


class ToolInputError(VerlMMToolsError, ValueError):
    """A model-written tool call is invalid. The message is shown to the model as the tool response."""


class ImageBudgetError(VerlMMToolsError):
    """An image does not fit the trajectory's image budget."""


class FileAccessError(VerlMMToolsError, PermissionError):
    """A path outside the configured file roots (or a URL, or not a regular file) was asked to be read."""


class ImageInputError(VerlMMToolsError, ValueError):
    """An image (from a dataset or a file) cannot be used: undecodable, too large, too elongated."""


class VideoInputError(VerlMMToolsError, ValueError):
    """A video (from a dataset or a file) cannot be used: no video stream, no frames, undecodable, too large or long."""


class TrajectoryValidationError(VerlMMToolsError):
    """A finished trajectory violates an invariant (token/mask lengths, image placeholders, ...)."""


class RemoteError(VerlMMToolsError, RuntimeError):
    """A tool or environment served by a Ray actor pool (``remote:``) could not answer: its actor was lost, its
    session is gone, or it did not start. The trajectory that needed it is masked; other trajectories go on."""


class RemoteTimeoutError(RemoteError, TimeoutError):
    """A remote call ran past the pool's ``timeout_s`` and was cancelled."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """A ' Did you mean ...?' suffix naming the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


class EndpointError(VerlMMToolsError, RuntimeError):
    """A model endpoint (``verl-mm-tools eval``) failed a request after its retries, or answered something that is
    not a chat completion."""
