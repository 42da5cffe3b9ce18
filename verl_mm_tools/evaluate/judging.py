"""``--judge``: ``eval`` and ``rescore`` score with the VLM judge (``rewards.judge.judge_reward``) at an
OpenAI-compatible endpoint. The flags (``add_judge_arguments``, read by ``judge_flags``), what they ask
(``JudgeFlags``: verl's reward overrides), and the judge's figures in a report (``judge_figures``). Light: the
commands' parsers read it without loading verl."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.judge.context import ImageChoice

__all__ = ["JudgeFlags", "add_judge_arguments", "hydra_value", "judge_figures", "judge_flags", "judge_row"]

JUDGE_FUNCTION = ("pkg://verl_mm_tools.rewards.judge", "judge_reward")  # verl's custom_reward_function path, name
DEFAULT_IMAGES = "all"
# judge_reward options the flags set: --judge-option may not set them too
FLAG_OF_OPTION = {"endpoint": "--judge", "model": "--judge-model", "rubric_path": "--judge-rubric"}
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class JudgeFlags:
    """The judge of ``--judge``: its endpoint (a base URL such as http://127.0.0.1:8000/v1) and model, a rubric file,
    the tool images it sees (``ImageChoice``; None: the loop config's ``judge_images``, else all) and the other
    ``judge_reward`` options (``--judge-option``)."""

    endpoint: str
    model: str
    rubric_path: Path | None = None
    images: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in self.options:
            if key in FLAG_OF_OPTION:
                raise ConfigError(f"--judge-option {key}=...: give it as {FLAG_OF_OPTION[key]}")
        if self.rubric_path is not None and not self.rubric_path.is_file():
            raise ConfigError(f"--judge-rubric {self.rubric_path}: no such file (a Jinja rubric, docs/judge.md)")
        if self.images is not None:
            ImageChoice.parse(self.images)

    @property
    def image_choice(self) -> ImageChoice:
        return ImageChoice.parse(self.images or DEFAULT_IMAGES)

    def reward_kwargs(self, rule_reward: str | None) -> dict[str, Any]:
        """``judge_reward``'s options; ``rule_reward`` (a command's ``--reward-fn``) joins the judge's score."""
        kwargs: dict[str, Any] = {"endpoint": self.endpoint, "model": self.model, **self.options}
        if self.rubric_path is not None:
            kwargs["rubric_path"] = str(self.rubric_path.resolve())
        if rule_reward is not None:
            if "rule_reward" in self.options:
                raise ConfigError(
                    f"--reward-fn {rule_reward} and --judge-option rule_reward={self.options['rule_reward']}: "
                    "name the rule reward once"
                )
            if "rule_weight" not in self.options:
                raise ConfigError(
                    f"--reward-fn {rule_reward} with --judge adds that rule reward to the judge's: give its weight "
                    f"with --judge-option rule_weight=W (reward = judge_weight x judge + W x {rule_reward})"
                )
            kwargs["rule_reward"] = rule_reward
        return kwargs

    def check(self, rule_reward: str | None) -> None:
        """Every option parsed as ``judge_reward`` will parse it (the rubric read and rendered), before any model
        loads: a ConfigError saying what is wrong."""
        from verl_mm_tools.rewards.judge import JudgeSettings

        JudgeSettings.from_options(self.reward_kwargs(rule_reward))

    def overrides(self, rule_reward: str | None) -> list[str]:
        """verl's trainer config scoring with ``judge_reward`` at this endpoint."""
        path, name = JUDGE_FUNCTION
        return [
            f"reward.custom_reward_function.path={path}",
            f"reward.custom_reward_function.name={name}",
            "+reward.custom_reward_function.reward_kwargs=" + hydra_value(self.reward_kwargs(rule_reward)),
        ]

    def describe(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "model": self.model,
            "rubric_path": str(self.rubric_path) if self.rubric_path is not None else None,
            "images": self.image_choice.kind + (f":{self.image_choice.count}" if self.image_choice.count else ""),
            "options": dict(self.options),
        }


def hydra_value(value: Any) -> str:
    """``value`` (JSON-like) as a hydra override's value that gives it back exactly: strings quoted, their quotes,
    backslashes before a quote or the end, and ``${`` (an interpolation) escaped."""
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str) or not _KEY.fullmatch(key):
                raise ConfigError(f"judge option key {key!r} must be a name (letters, digits, _)")
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        return repr(value)
    text = re.sub(r"(\\*)'", lambda match: match.group(1) * 2 + "\\'", str(value))
    text = re.sub(r"(\\*)\$\{", lambda match: match.group(1) * 2 + "\\${", text)
    return "'" + re.sub(r"(\\+)$", lambda match: match.group(1) * 2, text) + "'"


def _image_choice(text: str) -> str:
    """An argparse ``type``: all, none, named or last:N."""
    try:
        ImageChoice.parse(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"must be all, none, named or last:N (N >= 1), got {text!r}") from None
    return text


def add_judge_arguments(command: argparse.ArgumentParser, images_help: str) -> None:
    group = command.add_argument_group(
        "judge", "score with a VLM judge (judge_reward, docs/judge.md) at an OpenAI-compatible endpoint"
    )
    group.add_argument("--judge", metavar="URL", help="the judge's base URL, e.g. http://127.0.0.1:8000/v1")
    group.add_argument("--judge-model", metavar="NAME", help="the name the judge endpoint serves (with --judge)")
    group.add_argument("--judge-rubric", type=Path, metavar="PATH", help="a Jinja rubric file (default: correctness)")
    group.add_argument("--judge-images", type=_image_choice, metavar="CHOICE", help=images_help)
    group.add_argument(
        "--judge-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another judge_reward option, a YAML value (max_score=10, fallback_score=0, timeout_s=60, "
        "rule_weight=0.5 to add --reward-fn's score, ...); repeatable",
    )


def judge_flags(args: argparse.Namespace) -> JudgeFlags | None:
    """The judge the command's ``--judge*`` flags ask for; None without ``--judge``."""
    if args.judge is None:
        given = [flag for flag, value in _judge_flag_values(args) if value]
        if given:
            raise ConfigError(f"{given[0]} needs --judge URL (the judge's OpenAI-compatible base URL)")
        return None
    if not args.judge_model:
        raise ConfigError("--judge needs --judge-model NAME (the name the judge endpoint serves its model under)")
    return JudgeFlags(
        endpoint=args.judge,
        model=args.judge_model,
        rubric_path=args.judge_rubric,
        images=args.judge_images,
        options=_options(args.judge_option),
    )


def _judge_flag_values(args: argparse.Namespace) -> list[tuple[str, Any]]:
    return [
        ("--judge-model", args.judge_model),
        ("--judge-rubric", args.judge_rubric),
        ("--judge-images", args.judge_images),
        ("--judge-option", args.judge_option),
    ]


def _options(items: Sequence[str]) -> dict[str, Any]:
    import yaml

    options: dict[str, Any] = {}
    for item in items:
        key, equals, text = item.partition("=")
        key = key.strip()
        if not equals or not _KEY.fullmatch(key):
            raise ConfigError(f"--judge-option takes KEY=VALUE (e.g. max_score=10), got {item!r}")
        if key in options:
            raise ConfigError(f"--judge-option {key} is given twice")
        try:
            options[key] = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise ConfigError(f"--judge-option {item!r}: the value is not YAML ({error})") from error
    return options


# the judge's fields in reward_extra_info (rewards.judge.JUDGE_KEYS) the reports read
JUDGE_COLUMNS = JUDGE_SCORE, JUDGED, UNPARSEABLE, FAILED, CACHED = (
    "judge_score",
    "judge_judged",
    "judge_unparseable",
    "judge_failed",
    "judge_cached",
)


def judge_figures(columns: Mapping[str, Sequence[Any]], rows: Sequence[int]) -> dict[str, Any] | None:
    """The judge's counts over ``rows`` of a scored batch's columns (its reward extra info): rows judged (a score
    read), parse failures, failed calls, cache hits, and the mean judge score of the judged ones on [0, 1]; None when
    no row was judged."""
    scored = [row for row in rows if JUDGE_SCORE in columns and columns[JUDGE_SCORE][row] is not None]
    if not scored:
        return None

    def count(key: str) -> int:
        return sum(int(float(columns[key][row])) for row in scored)

    judged = [float(columns[JUDGE_SCORE][row]) for row in scored if float(columns[JUDGED][row])]
    return {
        "judged": len(judged),
        "parse_failures": count(UNPARSEABLE),
        "failed": count(FAILED),
        "cache_hits": count(CACHED),
        "score_mean": sum(judged) / len(judged) if judged else None,
    }


def judge_row(columns: Mapping[str, Sequence[Any]], row: int) -> dict[str, Any] | None:
    """One row's verdict for its report line: the judge score (on [0, 1], the fallback when not judged), how it
    ended (judged, unparseable or failed) and whether it came from the cache; None for a row not judged."""
    if JUDGE_SCORE not in columns or columns[JUDGE_SCORE][row] is None:
        return None
    ended = "judged" if float(columns[JUDGED][row]) else "unparseable" if float(columns[UNPARSEABLE][row]) else "failed"
    return {
        "score": float(columns[JUDGE_SCORE][row]),
        "verdict": ended,
        "cached": bool(float(columns[CACHED][row])),
    }
