"""Scoring rebuilt trajectories through verl's own reward worker (``RewardLoopWorker``, in-process, on verl's trainer
config with the chosen manager and function), all of one model's records at once on verl's event loop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from verl_mm_tools.errors import ConfigError, did_you_mean
from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.record import RecordError, jsonable
from verl_mm_tools.trajectories.read import LoadedRecord, RecordSet
from verl_mm_tools.trajectories.rescore_input import ChatRenderer, manager_input
from verl_mm_tools.trajectories.rescore_options import RescoreOptions

if TYPE_CHECKING:
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.protocol import DataProto

REWARDS_MODULE = "pkg://verl_mm_tools.rewards"  # where verl's custom_reward_function finds our functions by name
JUDGE_CONTEXT = SampleFields.key("judge_context")


@dataclass
class Rescored:
    """One record scored again: its new score and reward extra info, and whether its tokens were rebuilt as
    recorded."""

    item: LoadedRecord
    score: float
    extra: dict
    tokens_as_recorded: bool
    fields: dict  # the loop's extra fields as rebuilt (the report's columns)
    mode: str | None = None  # the eval mode of its output folder; None outside an eval output
    copy: Path | None = None  # its copy under OUT/trajectories


def check_choices(options: RescoreOptions) -> None:
    """The manager and the function exist, the judge's options parse (before any model is loaded)."""
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

    import verl_mm_tools.plugin  # noqa: F401  registers our managers into verl's registry
    from verl_mm_tools.rewards.registry import get_reward_function

    if options.reward_manager not in REWARD_MANAGER:
        choices = sorted(REWARD_MANAGER)
        raise ConfigError(
            f"--reward-manager {options.reward_manager!r} is not in verl's reward-manager registry; registered: "
            f"{choices}." + did_you_mean(options.reward_manager, choices)
        )
    if options.reward_fn is not None:
        get_reward_function(options.reward_fn)  # a ConfigError naming the built-in functions
    if options.judge is not None:
        options.judge.check(options.reward_fn)


def score_with_model(
    model_path: str, items: list[LoadedRecord], loaded: RecordSet, options: RescoreOptions
) -> list[Rescored]:
    try:  # a model that does not load costs its records, not the others (a bad setting raises a ConfigError)
        worker = reward_worker(model_path, options)
        renderer = ChatRenderer.load(model_path, worker.config)
    except OSError as error:
        for item in items:
            loaded.refuse(item, f"cannot load the tokenizer and processor of {model_path} ({error}): pass --model-path")
        return []
    inputs = []
    judge_images = options.judge.image_choice if options.judge is not None else None
    for item in items:
        try:
            inputs.append((item, manager_input(item, renderer, options.reward_fn, judge_images)))
        except RecordError as error:
            loaded.refuse(item, str(error))
        except Exception as error:  # noqa: BLE001  a record the template or processor cannot take costs only itself
            loaded.refuse(item, f"its conversation cannot be rebuilt ({type(error).__name__}: {error})")
    results = _compute_scores(worker, [prepared.data for _, prepared in inputs])
    scored = []
    for (item, prepared), result in zip(inputs, results, strict=True):
        if isinstance(result, BaseException):
            failure = f"{type(result).__name__}: {result}"
            loaded.refuse(item, f"reward manager {options.reward_manager!r} failed on it: {failure}")
            continue
        extra = _plain(result.get("reward_extra_info") or {})
        fields = {key: value for key, value in prepared.fields.items() if key != JUDGE_CONTEXT}  # its PNGs: done
        scored.append(Rescored(item, float(_plain(result["reward_score"])), extra, prepared.tokens_as_recorded, fields))
    return scored


def reward_worker(model_path: str, options: RescoreOptions) -> RewardLoopWorker:
    """verl's ``RewardLoopWorker`` on verl's trainer config with the chosen manager and function (the judge's
    ``judge_reward`` with ``--judge``), in-process."""
    from verl_mm_tools.rewards.managers import REWARD_MANAGERS
    from verl_mm_tools.runtime.config import compose_trainer_config
    from verl_mm_tools.runtime.workers import in_process_reward_worker

    overrides = [f"reward.reward_manager.name={options.reward_manager}"]
    if options.judge is not None:  # judge_reward, with reward_fn as its rule reward
        overrides += options.judge.overrides(options.reward_fn)
    elif options.reward_fn is not None and options.reward_manager in REWARD_MANAGERS:
        overrides.append(f"+reward.reward_kwargs.reward_fn={options.reward_fn}")  # how our managers name it
    elif options.reward_fn is not None:  # verl's managers score with reward.custom_reward_function
        overrides += [
            f"reward.custom_reward_function.path={REWARDS_MODULE}",
            f"reward.custom_reward_function.name={options.reward_fn}",
        ]
    config = compose_trainer_config(model_path, [*overrides, *options.overrides])
    if config.reward.reward_model.enable:
        raise ConfigError(
            "reward.reward_model.enable=true: rescore runs no reward-model server; score with a reward function"
        )
    return in_process_reward_worker(config)


def _compute_scores(worker: RewardLoopWorker, batches: list[DataProto]) -> list[dict | BaseException]:
    """``worker.compute_score`` on every batch at once, on verl's event loop (the one the worker's manager
    captured); a ConfigError stops everything (every record would fail the same way), other errors are per record."""
    from verl.utils.ray_utils import get_event_loop

    async def run() -> list[dict | BaseException]:
        return await asyncio.gather(*(worker.compute_score(batch) for batch in batches), return_exceptions=True)

    results = get_event_loop().run_until_complete(run())
    for result in results:
        if isinstance(result, ConfigError):
            raise result
    return results


def _plain(value: Any) -> Any:
    """Tensors (verl's DAPO manager adds one to the score) as Python numbers, then plain JSON types."""
    if hasattr(value, "tolist") and not isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return jsonable(value)
