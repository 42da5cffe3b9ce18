"""A benchmark figure: the median of its samples with their spread, a check when it has a target; and the summary
line over a run's figures."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One figure: the median of its ``samples`` (a single sample: counted or derived, not timed). With a
    ``target`` (e.g. ``"<= 1.05"``) it is a check, met or missed; without one it is informational."""

    name: str
    samples: tuple[float, ...]
    target: str | None = None

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError(f"figure {self.name!r} has no samples; measure at least once")
        if self.target is not None and (len(self.target.split()) != 2 or self.target.split()[0] not in ("<=", ">=")):
            raise ValueError(f"figure {self.name!r}: target must look like '<= 1.05' or '>= 2', got {self.target!r}")

    @property
    def value(self) -> float:
        return statistics.median(self.samples)

    @property
    def missed(self) -> bool:
        if self.target is None:
            return False
        op, bound = self.target.split()
        return not (self.value <= float(bound) if op == "<=" else self.value >= float(bound))

    def line(self) -> str:
        if len(self.samples) == 1:
            text = f"{self.name}: {self.value:.4g}"
        else:
            text = (
                f"{self.name}: median {self.value:.4g} (min {min(self.samples):.4g}, max {max(self.samples):.4g}, "
                f"n={len(self.samples)})"
            )
        if self.target is not None:
            text += f", target {self.target}: {'MISSED' if self.missed else 'met'}"
        return text

    def reason(self) -> str:
        """Why a check was missed, in a few words: ``median 1.06 > 1.05``."""
        if self.target is None:
            raise ValueError(f"figure {self.name!r} has no target: it is informational, never missed")
        op, bound = self.target.split()
        return f"{'median ' if len(self.samples) > 1 else ''}{self.value:.4g} {'>' if op == '<=' else '<'} {bound}"


def figure(name: str, samples: Sequence[float], target: str | None = None) -> Figure:
    return Figure(name, tuple(float(sample) for sample in samples), target)


def missed(figures: Sequence[Figure]) -> list[Figure]:
    return [each for each in figures if each.missed]


def summary(figures: Sequence[Figure]) -> str:
    """``N checks met, M missed: NAME (REASON), ...``: informational figures are not counted."""
    checks = [each for each in figures if each.target is not None]
    failed = missed(checks)
    text = f"{len(checks) - len(failed)} checks met, {len(failed)} missed"
    return text + (": " + ", ".join(f"{each.name} ({each.reason()})" for each in failed) if failed else "")
