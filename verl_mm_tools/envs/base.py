"""The environment API of the mm_tool loop: gym-like, with observations that may carry images.

After an assistant turn without a tool call, the loop hands the assistant's text to the trajectory's environment
(``step``); unless the environment is done, its observation becomes the next user message (its images enter the
image workspace with ids, through the image budget) and the model answers again, up to the turn limit.

An environment is chosen per dataset sample (``extra_info.env``: a registered name or an importable class path
``package.module.Class``, or ``{"name": ..., <kwargs>}``) or for every sample by the loop's ``env`` option. A class
path is imported where the loop runs (verl's rollout workers), so an environment defined in your own module works
without registering it in each worker. One instance serves one trajectory: ``reset`` once, ``step`` per
answer, ``close`` exactly once at the end, however the trajectory ends. ``reset``/``step``/``close`` may be plain or
``async`` methods. With a ``remote:`` key in the spec the environment runs on a Ray actor pool instead of in the
rollout worker (``verl_mm_tools.remote.env``): the way to run a slow or blocking simulator.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, cast, overload

from PIL import Image

from verl_mm_tools.errors import ConfigError, did_you_mean
from verl_mm_tools.files import FileRoots
from verl_mm_tools.judge.context import prompt_question
from verl_mm_tools.verl_registry import register_unique

T = TypeVar("T")


@dataclass(frozen=True)
class Observation:
    """What the environment shows the model: text and images (each image gets the next workspace id)."""

    text: str = ""
    images: tuple[Image.Image, ...] = ()


@dataclass(frozen=True)
class Sample:
    """The dataset row an environment is reset with."""

    data_source: str | None
    ground_truth: Any
    extra_info: dict[str, Any]
    images: list[Image.Image] = field(default_factory=list)  # the prompt's images: ids 1..len(images)
    files: FileRoots = field(default_factory=FileRoots)  # read files only through these (the loop's file_roots)
    question: str = ""  # the text of the dataset prompt's user messages (``judge.context.prompt_question``)

    @classmethod
    def from_row(cls, row: dict[str, Any], images: list[Image.Image], files: FileRoots | None = None) -> Sample:
        reward_model = row.get("reward_model") or {}
        return cls(
            data_source=row.get("data_source"),
            ground_truth=reward_model.get("ground_truth") if isinstance(reward_model, dict) else None,
            extra_info=dict(row.get("extra_info") or {}),
            images=list(images),
            files=files or FileRoots(),
            question=prompt_question(list(row.get("raw_prompt") or [])),
        )


class Environment:
    """Base class: implement ``step`` (and ``reset`` when the environment keeps state from the sample)."""

    name: ClassVar[str] = ""

    def reset(self, sample: Sample) -> Observation | None:
        """Start a trajectory. An observation returned here is appended to the prompt as a user message."""
        return None

    def step(self, assistant_text: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        """React to the assistant's answer: (observation, reward, done, info)."""
        raise NotImplementedError(
            f"environment {type(self).__qualname__} does not implement step(assistant_text) -> (Observation, reward, "
            "done, info): every Environment subclass must"
        )

    def close(self) -> None:
        """Free what the trajectory held (called exactly once)."""


ENVIRONMENTS: dict[str, type[Environment]] = {}
# Built-in environments whose modules need optional packages: imported when first selected, by name.
OPTIONAL_ENVIRONMENTS = {"miniwob": "verl_mm_tools.envs.gui.miniwob_env.MiniWoBEnv"}
OPTIONAL_INSTALL = (
    "install the GUI extra (pip install 'verl-mm-tools[gui]') and the browser (scripts/install_chromium.sh)"
)
REMOTE_KEY = "remote"  # in an environment spec: serve it from a Ray actor pool (``verl_mm_tools.remote``)


def register_environment(cls: type[Environment]) -> type[Environment]:
    """Class decorator: make an environment selectable by its ``name``."""
    if not cls.name:
        raise ConfigError(f"environment class {cls.__qualname__} needs a non-empty `name` class attribute")
    if cls.step is Environment.step:
        raise ConfigError(
            f"environment class {cls.__qualname__} does not implement step(assistant_text) -> "
            "(Observation, reward, done, info); an environment without it cannot react to an answer"
        )
    register_unique(ENVIRONMENTS, cls.name, cls, "environment")
    return cls


def make_environment(spec: str | dict[str, Any]) -> Environment:
    """An environment instance from a name or ``{"name": ..., **kwargs}``."""
    if isinstance(spec, str):
        name, kwargs = spec, {}
    elif isinstance(spec, dict) and isinstance(spec.get("name"), str):
        name, kwargs = spec["name"], {key: value for key, value in spec.items() if key != "name"}
    else:
        raise ConfigError(f"an environment is selected by a name or a mapping with a 'name' key, got {spec!r}")
    environment_class = ENVIRONMENTS.get(name) or _imported_environment(OPTIONAL_ENVIRONMENTS.get(name, name))
    remote = kwargs.pop(REMOTE_KEY, None)
    if remote is not None:
        return _remote_environment(name, environment_class, kwargs, remote)
    try:
        return environment_class(**kwargs)
    except TypeError as error:
        raise ConfigError(f"environment {name!r} does not accept {sorted(kwargs)}: {error}") from error


def _remote_environment(
    name: str, environment_class: type[Environment], kwargs: dict[str, Any], remote: object
) -> Environment:
    """The environment on a Ray actor pool (``remote:``); its arguments are checked here, where it is not built. Its
    methods are async: the loop calls them through ``call``, as an environment's own async methods."""
    from verl_mm_tools.remote.env import RemoteEnvironment, RemoteScreenEnvironment
    from verl_mm_tools.remote.spec import RemoteSpec

    try:
        inspect.signature(environment_class).bind(**kwargs)
    except TypeError as error:
        raise ConfigError(f"environment {name!r} does not accept {sorted(kwargs)}: {error}") from error
    spec = RemoteSpec.from_config(remote, f"environment {name!r}")
    # a GUI environment's actions (the GUI tools' ``act``) go to its actor too
    remote_class = RemoteScreenEnvironment if callable(getattr(environment_class, "act", None)) else RemoteEnvironment
    return cast(Environment, remote_class(name, environment_class, kwargs, spec))


def _imported_environment(path: str) -> type[Environment]:
    """An Environment subclass by its class path (``package.module.Class``)."""
    module_name, _, class_name = path.rpartition(".")
    if not module_name:
        names = sorted({*ENVIRONMENTS, *OPTIONAL_ENVIRONMENTS})
        raise ConfigError(
            f"unknown environment {path!r}; registered: {names} (or give a class path, package.module.Class)."
            + did_you_mean(path, names)
        )
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        fix = (
            OPTIONAL_INSTALL
            if path in OPTIONAL_ENVIRONMENTS.values()
            else ("check the class path and that its module is importable where verl's rollout workers run")
        )
        reason = f"{type(error).__name__}: {error}"
        raise ConfigError(f"environment {path!r} cannot be imported ({reason}); {fix}") from error
    if not (isinstance(found, type) and issubclass(found, Environment)):
        raise ConfigError(f"environment {path!r} is a {type(found).__name__}, not an Environment subclass")
    if found.step is Environment.step:
        raise ConfigError(f"environment {path!r} does not implement step(assistant_text)")
    return found


@overload
async def call(method: Callable[..., Awaitable[T]], *args: object) -> T: ...
@overload
async def call(method: Callable[..., T], *args: object) -> T: ...
async def call(method: Callable[..., object], *args: object) -> object:
    """Call a plain or async environment method."""
    result = method(*args)
    return await result if inspect.isawaitable(result) else result
