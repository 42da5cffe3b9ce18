"""The ``remote:`` block of a tool YAML entry or an environment spec: how many Ray actors serve it and how.

No Ray import: configs are checked where they are read (the driver, the dataset), not only in a worker.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from verl_mm_tools.errors import ConfigError, did_you_mean

REMOTE_ACTOR_METRIC = "remote_actor"  # in a remote tool's call metrics: the actor that answered


@dataclasses.dataclass(frozen=True)
class RemoteSpec:
    """``remote: {actors, num_cpus, num_gpus, max_concurrency, timeout_s, max_restarts, startup_timeout_s,
    resources}``.

    actors: Ray actors in the pool; a trajectory's session stays on one of them for its whole life.
    num_cpus / num_gpus: each actor's Ray resources (num_cpus None: Ray's actor default, 1 CPU to place, 0 held).
    max_concurrency: calls one actor runs at once, each on its own thread (a blocking tool blocks only its thread).
    timeout_s: a tool call (or environment reset/step) past this is cancelled: a tool answers the model with an error
        text, an environment masks its trajectory. None: only the loop's tool_timeout_s applies.
    max_restarts: times Ray restarts a dead actor (its sessions are lost: their trajectories are masked).
    startup_timeout_s: how long an actor may take to start (placement, imports, the tool's constructor).
    resources: custom Ray resources each actor holds ({node_b: 1}: only a node offering node_b can host it; how a
        pool is placed on chosen nodes of a multi-node cluster).
    """

    actors: int = 1
    num_cpus: float | None = None
    num_gpus: float = 0.0
    max_concurrency: int = 1
    timeout_s: float | None = None
    max_restarts: int = 3
    startup_timeout_s: float = 120.0
    # a mapping: compared, not hashed (the spec keys this process's pools)
    resources: Mapping[str, float] = dataclasses.field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        _require(
            isinstance(self.actors, int) and not isinstance(self.actors, bool) and self.actors >= 1,
            "actors",
            "an integer >= 1",
            self.actors,
        )
        _require(
            isinstance(self.max_concurrency, int)
            and not isinstance(self.max_concurrency, bool)
            and self.max_concurrency >= 1,
            "max_concurrency",
            "an integer >= 1",
            self.max_concurrency,
        )
        _require(
            isinstance(self.max_restarts, int) and not isinstance(self.max_restarts, bool) and self.max_restarts >= 0,
            "max_restarts",
            "an integer >= 0",
            self.max_restarts,
        )
        _require(
            self.num_cpus is None or _number(self.num_cpus, minimum=0),
            "num_cpus",
            "a number >= 0 or null",
            self.num_cpus,
        )
        _require(
            _number(self.num_gpus, minimum=0), "num_gpus", "a number >= 0 (a fraction shares a GPU)", self.num_gpus
        )
        _require(
            self.timeout_s is None or _number(self.timeout_s, minimum=0, strict=True),
            "timeout_s",
            "a number of seconds > 0 or null",
            self.timeout_s,
        )
        _require(
            _number(self.startup_timeout_s, minimum=0, strict=True),
            "startup_timeout_s",
            "a number of seconds > 0",
            self.startup_timeout_s,
        )
        _require(
            isinstance(self.resources, Mapping)
            and all(isinstance(key, str) and _number(value, minimum=0) for key, value in self.resources.items()),
            "resources",
            "a mapping of Ray resource names to numbers >= 0, such as {node_b: 1}",
            self.resources,
        )
        reserved = sorted({"CPU", "GPU"} & set(self.resources) if isinstance(self.resources, Mapping) else set())
        _require(not reserved, "resources", "free of CPU and GPU (use num_cpus / num_gpus)", self.resources)

    @classmethod
    def from_config(cls, config: object, owner: str) -> RemoteSpec:
        """Parse a ``remote:`` mapping (``True``: every default). ``owner`` names the tool or environment."""
        if config is True:
            return cls()
        if not isinstance(config, Mapping):
            raise ConfigError(
                f"{owner}: remote must be a mapping such as {{actors: 2, max_concurrency: 1}} (or true "
                f"for one actor), got {config!r}"
            )
        fields = {field.name for field in dataclasses.fields(cls)}
        for key in config:
            if key not in fields:
                raise ConfigError(
                    f"{owner}: unknown remote option {key!r}.{did_you_mean(str(key), fields)} "
                    f"Known options: {sorted(fields)}"
                )
        try:
            return cls(**dict(config))
        except ConfigError as error:
            raise ConfigError(f"{owner}: {error}") from None

    def actor_options(self) -> dict[str, Any]:
        """Ray's ``.options()`` for one actor of the pool."""
        options: dict[str, Any] = {"max_concurrency": self.max_concurrency, "max_restarts": self.max_restarts}
        # only what was asked for: naming any resource (even num_gpus=0) makes Ray hold 1 CPU for the actor's life
        if self.num_cpus is not None:
            options["num_cpus"] = self.num_cpus
        if self.num_gpus:
            options["num_gpus"] = self.num_gpus
        if self.resources:
            options["resources"] = dict(self.resources)
        return options


def _number(value: object, *, minimum: float, strict: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value > minimum if strict else value >= minimum


def _require(ok: bool, name: str, expected: str, got: object) -> None:
    if not ok:
        raise ConfigError(f"remote {name} must be {expected}, got {got!r}")
