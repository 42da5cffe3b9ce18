"""Reward managers for verl's reward loop (``verl.experimental.reward_loop``).

``mm_turn_discount`` scores the final answer of a trajectory and discounts it by the number of attempts:

    ``score = raw_score * gamma ** (attempts - 1)``

so a right answer on the first attempt keeps its full reward and each retry after feedback costs a factor gamma.

Selecting it (the classes in :data:`REWARD_MANAGERS` are registered into verl's registry as this module is imported)::

    reward.reward_manager.name=mm_turn_discount
    +reward.reward_kwargs.gamma=0.9                      # in (0, 1]; default 0.9
    +reward.reward_kwargs.reward_fn=rotation_reward_45   # optional, a name from REWARD_FUNCTIONS
    +reward.reward_kwargs.reward_fn_kwargs.require_tag=true
    +reward.reward_kwargs.tool_shaping.budget=2          # optional, see rewards.shaping.ToolShaping

``reward.reward_kwargs`` is the dict verl's own DAPO manager reads (``config.reward.reward_kwargs``; the legacy
``reward_model.reward_kwargs`` is migrated there by verl). It is not in verl's YAML, hence the ``+``.

Which function scores a sample, first match wins: the row's ``extra_info["reward_fn"]`` (a built-in name);
``reward_kwargs.reward_fn``; the ``compute_score`` verl hands every manager (``reward.custom_reward_function`` when
set, else verl's ``default_compute_score``, which dispatches on ``data_source``).

Where attempts, tool calls and the text come from: see :mod:`verl_mm_tools.rewards.common`. In short, the agent
loop writes ``attempts``, ``tool_call_counts`` and optionally ``last_assistant_text`` into
``AgentLoopOutput.extra_fields``; verl passes them here as ``non_tensor_batch["tool_extra_fields"]`` (or as
top-level columns on the batch path); they are merged over the row's ``extra_info`` before scoring.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math
import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from omegaconf import DictConfig, OmegaConf
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RawRewardFn, RewardManagerBase
from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

from verl_mm_tools.errors import ConfigError, TrajectoryValidationError, did_you_mean
from verl_mm_tools.rewards.common import (
    ATTEMPTS_KEY,
    LAST_ASSISTANT_TEXT_KEY,
    REWARD_FN_KEY,
    TOOL_CALLS_KEY,
    as_result_dict,
    read_tool_calls,
)
from verl_mm_tools.rewards.environment import STOP_REASON_KEY, TOOL_REWARDS_KEY, TURN_SCORES_KEY
from verl_mm_tools.rewards.registry import RewardFunction, get_reward_function
from verl_mm_tools.rewards.shaping import ToolShaping
from verl_mm_tools.verl_registry import register_unique

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from verl.protocol import DataProtoItem

logger = logging.getLogger(__name__)

__all__ = ["REWARD_EXTRA_KEYS", "REWARD_MANAGERS", "MMTurnDiscountRewardManager", "TurnDiscountConfig"]

# Keys of ``reward.reward_kwargs`` that belong to verl's DAPO manager: tolerated so that switching managers does
# not require deleting them.
_FOREIGN_REWARD_KWARGS = frozenset({"overlong_buffer_cfg", "max_resp_len"})
# Trajectory keys read from top-level columns on verl's batch reward path (no tool_extra_fields there).
_TRAJECTORY_KEYS = (
    ATTEMPTS_KEY,
    TOOL_CALLS_KEY,
    LAST_ASSISTANT_TEXT_KEY,
    TOOL_REWARDS_KEY,
    TURN_SCORES_KEY,
    STOP_REASON_KEY,
)

REWARD_EXTRA_KEYS = (
    "score",  # the final reward: raw_score * turn_discount
    "raw_score",  # the reward function's score, plus tool shaping when configured, before the discount
    "turn_discount",  # gamma ** (attempts - 1)
    "attempts",
    "tool_calls",  # None when the agent loop recorded no count
    # Fields of the built-in functions, None where the function has no such field. verl needs every sample to
    # carry the same keys (it builds columns from the first sample's keys), and rows may use different functions.
    "acc",
    "angle_error",
    "predicted_angle",
    "format_ok",
    "reason",
    "answer_score",
    "tool_shaping",
)
"""Keys present in every ``reward_extra_info`` this manager returns (a custom function may add more)."""


@dataclasses.dataclass(frozen=True)
class TurnDiscountConfig:
    """``mm_turn_discount`` settings, read once from ``config.reward.reward_kwargs``.

    Attributes:
        gamma: Discount per extra attempt, in (0, 1]; 1 disables discounting.
        reward_fn: Name of a built-in reward function scoring every row that names none; None uses verl's.
        reward_fn_kwargs: Keyword-only tunables passed to ``reward_fn``.
        tool_shaping: Tool-use shaping applied to the raw score before discounting; None for none.
    """

    gamma: float = 0.9
    reward_fn: str | None = None
    reward_fn_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tool_shaping: ToolShaping | None = None

    def __post_init__(self) -> None:
        gamma = self.gamma
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 < gamma <= 1:
            raise ConfigError(f"reward.reward_kwargs.gamma must be a number in (0, 1], got {gamma!r}")
        if self.reward_fn is not None:
            _check_function_kwargs(self.reward_fn, self.reward_fn_kwargs)
        elif self.reward_fn_kwargs:
            raise ConfigError(
                f"reward.reward_kwargs.reward_fn_kwargs {dict(self.reward_fn_kwargs)} given without reward_fn; "
                "name the function they are for"
            )

    @classmethod
    def from_mapping(cls, reward_kwargs: Mapping[str, Any]) -> TurnDiscountConfig:
        """Parse ``reward.reward_kwargs``; unknown keys are a ConfigError (a typo would silently do nothing)."""
        fields = [field.name for field in dataclasses.fields(cls)]
        for key in reward_kwargs:
            if key not in fields and key not in _FOREIGN_REWARD_KWARGS:
                raise ConfigError(
                    f"unknown key reward.reward_kwargs.{key} for mm_turn_discount; known keys are {fields}."
                    + did_you_mean(key, fields)
                )
        values = {key: value for key, value in reward_kwargs.items() if key in fields}
        if values.get("tool_shaping") is not None:
            values["tool_shaping"] = _parse_tool_shaping(values["tool_shaping"])
        values["reward_fn_kwargs"] = dict(values.get("reward_fn_kwargs") or {})
        return cls(**values)


def _parse_tool_shaping(raw: Mapping[str, Any]) -> ToolShaping:
    fields = [field.name for field in dataclasses.fields(ToolShaping)]
    for key in raw:
        if key not in fields:
            raise ConfigError(
                f"unknown key reward.reward_kwargs.tool_shaping.{key}; known keys are {fields}."
                + did_you_mean(key, fields)
            )
    return ToolShaping(**raw)


def _check_function_kwargs(name: str, kwargs: Mapping[str, Any]) -> None:
    parameters = inspect.signature(get_reward_function(name)).parameters
    tunables = [p.name for p in parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    for key in kwargs:
        if key not in tunables:
            raise ConfigError(
                f"reward.reward_kwargs.reward_fn_kwargs.{key} is not a tunable of {name}; its tunables are "
                f"{tunables}." + did_you_mean(key, tunables)
            )


def _plain_container(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


@functools.cache
def _warn_row_function_set_aside(name: str) -> None:
    logger.warning(
        "rows name their own reward function %r (extra_info.reward_fn), but judge_reward is the configured reward: the "
        "judge scores them. To add that rule to the judge's score, set judge_reward's rule_reward=%s and rule_weight.",
        name,
        name,
    )


class MMTurnDiscountRewardManager(RewardManagerBase):
    """Final score * gamma^(attempts-1), with the attempts and tool calls in ``reward_extra_info`` (see module)."""

    def __init__(
        self,
        config: DictConfig,
        tokenizer: Any,
        compute_score: RawRewardFn,
        reward_router_address: str | None = None,
        reward_model_tokenizer: Any = None,
    ):
        super().__init__(config, tokenizer, compute_score)
        reward_config = config.reward
        self.settings = TurnDiscountConfig.from_mapping(_plain_container(reward_config.get("reward_kwargs")) or {})
        custom_path = (reward_config.get("custom_reward_function") or {}).get("path")
        if custom_path and self.settings.reward_fn is not None:
            raise ConfigError(
                f"both reward.custom_reward_function.path ({custom_path!r}) and reward.reward_kwargs.reward_fn "
                f"({self.settings.reward_fn!r}) are set; keep one"
            )
        self.default_function = self._default_function(compute_score)
        # a judge configured as the reward scores every row: a row's own reward_fn would skip it (``_select_function``)
        self.judges = (reward_config.get("custom_reward_function") or {}).get("name") == "judge_reward"
        self.reward_router_address = reward_router_address
        self.reward_model_tokenizer = reward_model_tokenizer

    def _default_function(self, compute_score: RawRewardFn) -> RewardFunction:
        if self.settings.reward_fn is not None:
            return functools.partial(get_reward_function(self.settings.reward_fn), **self.settings.reward_fn_kwargs)
        if compute_score is not None:
            return compute_score
        from verl.utils.reward_score import default_compute_score

        return default_compute_score

    async def run_single(self, data: DataProto) -> dict:
        """Score one trajectory (the last sequence of ``data``); returns ``reward_score`` and ``reward_extra_info``."""
        item = data[-1:][0]  # multi-sequence outputs: the last sequence holds the final answer
        extra_info = self._extra_info(item)
        attempts = _read_attempts(extra_info)
        function = self._select_function(extra_info)
        solution_str = await self._solution_text(item, extra_info)
        kwargs = {
            "data_source": item.non_tensor_batch["data_source"],
            "solution_str": solution_str,
            "ground_truth": item.non_tensor_batch["reward_model"]["ground_truth"],
            "extra_info": extra_info,
        }
        raw = await self._call(function, kwargs)
        return self._assemble(raw, attempts, extra_info)

    def _extra_info(self, item: DataProtoItem) -> dict[str, Any]:
        # Copies: the row's dict and the agent loop's extra_fields are shared objects in-process.
        extra_info = dict(item.non_tensor_batch.get("extra_info") or {})
        extra_info.update(_trajectory_fields(item.non_tensor_batch))
        extra_info["num_turns"] = item.non_tensor_batch.get("__num_turns__")
        extra_info["rollout_reward_scores"] = item.non_tensor_batch.get("reward_scores", {})
        return extra_info

    def _select_function(self, extra_info: Mapping[str, Any]) -> RewardFunction:
        row_choice = extra_info.get(REWARD_FN_KEY)
        if row_choice is not None and self.judges:
            _warn_row_function_set_aside(row_choice)
            return self.default_function
        return self.default_function if row_choice is None else get_reward_function(row_choice)

    async def _solution_text(self, item: DataProtoItem, extra_info: Mapping[str, Any]) -> str:
        last_text = extra_info.get(LAST_ASSISTANT_TEXT_KEY)
        if isinstance(last_text, str):
            return last_text
        response_ids = item.batch["responses"]
        valid_length = item.batch["attention_mask"][-response_ids.shape[-1] :].sum()
        valid_ids = response_ids[:valid_length]
        # verl annotates RewardManagerBase.tokenizer as the AutoTokenizer factory class; it holds a tokenizer instance
        decode = cast("PreTrainedTokenizerBase", self.tokenizer).decode
        return await self.loop.run_in_executor(None, functools.partial(decode, valid_ids, skip_special_tokens=True))

    async def _call(self, function: RewardFunction, kwargs: dict[str, Any]) -> Any:
        if self.reward_router_address is not None:
            kwargs["reward_router_address"] = self.reward_router_address
            kwargs["reward_model_tokenizer"] = self.reward_model_tokenizer
        if inspect.iscoroutinefunction(function):
            return await function(**kwargs)
        return await self.loop.run_in_executor(None, functools.partial(function, **kwargs))

    def _shape(self, result: dict[str, Any], extra_info: Mapping[str, Any]) -> dict[str, Any]:
        shaping = self.settings.tool_shaping
        if shaping is None:
            return result
        answer_score = result["score"]
        term = shaping.shaping(read_tool_calls(extra_info), answer_score=answer_score)
        return {**result, "score": answer_score + term, "answer_score": answer_score, "tool_shaping": term}

    def _assemble(self, raw: float | Mapping[str, Any], attempts: int, extra_info: Mapping[str, Any]) -> dict[str, Any]:
        result = self._shape(as_result_dict(raw), extra_info)
        discount = float(self.settings.gamma) ** (attempts - 1)
        score = result["score"] * discount
        recorded_calls = read_tool_calls(extra_info) if extra_info.get(TOOL_CALLS_KEY) is not None else None
        reward_extra_info: dict[str, Any] = dict.fromkeys(REWARD_EXTRA_KEYS)
        if not isinstance(raw, Mapping):
            reward_extra_info["acc"] = result["score"]  # as verl's naive manager does for a bare number
        reward_extra_info.update(result)
        reward_extra_info.update(
            score=score,
            raw_score=result["score"],
            turn_discount=discount,
            attempts=attempts,
            tool_calls=recorded_calls,
        )
        logger.debug("attempts=%d raw=%.4f discounted=%.4f", attempts, result["score"], score)
        return {"reward_score": score, "reward_extra_info": reward_extra_info}


def _trajectory_fields(non_tensor: Mapping[str, Any]) -> dict[str, Any]:
    """The agent loop's extra_fields as verl delivers them on either reward path."""
    fields = non_tensor.get("tool_extra_fields")
    if not isinstance(fields, Mapping):
        fields = {key: non_tensor.get(key) for key in _TRAJECTORY_KEYS}
    # None means "not recorded": it must not hide a value the dataset row carries.
    return {key: value for key, value in fields.items() if value is not None}


def _read_attempts(extra_info: Mapping[str, Any]) -> int:
    attempts = extra_info.get(ATTEMPTS_KEY)
    if attempts is None:
        return 1
    valid = isinstance(attempts, numbers.Real) and not isinstance(attempts, bool) and math.isfinite(attempts)
    if not valid or attempts != int(attempts) or attempts < 1:
        raise TrajectoryValidationError(
            f"extra_fields[{ATTEMPTS_KEY!r}] must be an integer >= 1 (answers given in the trajectory), "
            f"got {attempts!r}"
        )
    return int(attempts)


REWARD_MANAGERS: dict[str, type[RewardManagerBase]] = {"mm_turn_discount": MMTurnDiscountRewardManager}
"""Reward managers by the name ``reward.reward_manager.name`` selects: registered into verl's reward-loop registry
here, once defined (``verl_mm_tools.plugin`` imports this module when verl imports that registry)."""

for _name, _manager in REWARD_MANAGERS.items():
    register_unique(REWARD_MANAGER, _name, _manager, "reward manager")
