"""``judge_reward``: a VLM judge scores the trajectory's answer, seeing its question and images.

verl's custom reward function (async; verl's reward-loop managers await it)::

    reward.custom_reward_function.path=pkg://verl_mm_tools.rewards.judge
    reward.custom_reward_function.name=judge_reward
    +reward.custom_reward_function.reward_kwargs.max_score=10        # the options below, all optional

In training the judge is verl's reward model (``reward.reward_model.enable=True``): verl hands the function its
router's address and tokenizer, and the request goes to the router's ``/v1/chat/completions`` under the model's
path. ``endpoint`` (+ ``model``) names another OpenAI-compatible endpoint instead (``eval`` and ``rescore``).

What the judge sees: ``judge.rubric.JudgeRubric.messages`` (the rubric's instructions, the question, the images the
loop chose with its ``judge_images`` option, then the final answer as quoted data). The reward: the judge's score
scaled to [0, 1] (``min_score`` -> 0, ``max_score`` -> 1) times ``judge_weight``, plus ``rule_weight`` times the
built-in rule reward ``rule_reward`` when one is named (``combine``). A reply with no readable score, or no reply
after the retries, gets ``fallback_score`` in the judge's place and is counted; with ``on_failure: mask`` the
trajectory is also masked (trained on nothing) by the step hook. The verdict's fields go to ``reward_extra_info``
(``JUDGE_KEYS``), from which the step hook logs ``mm_tool/judge/*``.

Options (``reward_kwargs``): rubric (a Jinja template) or rubric_path (a file holding one), min_score (0),
max_score (10), max_answer_chars (8000), fallback_score (0.0, on the reward's [0, 1] scale), on_failure (fallback |
mask), judge_weight (1.0), rule_reward (None), rule_weight (0.0), rule_reward_kwargs ({}), endpoint, model,
timeout_s (120), retries (2), backoff_s (1), concurrency (16), max_tokens (256), temperature (0), cache_size (4096),
constrained (false: with true, a vLLM judge's reply is only the score tag, by vLLM's structured outputs),
prompt_digest (false: with true, a vLLM judge returns the prompt's token ids and judge_prompt_digest holds their
CRC-32).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_mm_tools.errors import ConfigError, did_you_mean
from verl_mm_tools.handoff import LAST_ASSISTANT_TEXT_KEY, SampleFields
from verl_mm_tools.judge.client import JudgeClient, JudgeEndpoint, verdict_key
from verl_mm_tools.judge.context import JudgeContext
from verl_mm_tools.judge.rubric import DEFAULT_RUBRIC, JudgeRubric
from verl_mm_tools.judge.verdict import Verdict, VerdictStatus
from verl_mm_tools.rewards.common import VERL_CALL_KWARGS, as_result_dict
from verl_mm_tools.rewards.registry import get_reward_function
from verl_mm_tools.rewards.text import strip_template_leftovers

__all__ = ["JUDGE_KEYS", "JudgeSettings", "judge_answer", "judge_reward"]

JUDGE_CONTEXT_KEY = SampleFields.key("judge_context")
# reward_extra_info of a judged trajectory (numbers only: verl averages them in validation)
JUDGE_KEYS = (
    "judge_score",
    "judge_judged",
    "judge_unparseable",
    "judge_failed",
    "judge_cached",
    "judge_latency_s",
    "judge_prompt_tokens",
    "judge_prompt_digest",
)
JUDGE_MASK_KEY = "judge_mask"  # 1.0: the step hook masks the trajectory (on_failure: mask)
ON_FAILURE = ("fallback", "mask")
_RUBRIC_OPTIONS = ("rubric", "rubric_path", "min_score", "max_score", "max_answer_chars")
_ENDPOINT_OPTIONS = tuple(f.name for f in dataclasses.fields(JudgeEndpoint) if f.name not in ("url", "model"))
_SETTINGS_OPTIONS = ("fallback_score", "on_failure", "judge_weight", "rule_reward", "rule_weight", "rule_reward_kwargs")
_OPTIONS = frozenset({*_RUBRIC_OPTIONS, *_ENDPOINT_OPTIONS, *_SETTINGS_OPTIONS, "endpoint", "model"})


@dataclasses.dataclass(frozen=True)
class JudgeSettings:
    rubric: JudgeRubric
    endpoint: JudgeEndpoint
    fallback_score: float = 0.0
    on_failure: str = "fallback"
    judge_weight: float = 1.0
    rule_reward: str | None = None
    rule_weight: float = 0.0
    rule_reward_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.on_failure not in ON_FAILURE:
            raise ConfigError(f"judge on_failure must be one of {ON_FAILURE}, got {self.on_failure!r}")
        for name in ("fallback_score", "judge_weight", "rule_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"judge {name} must be a finite number, got {value!r}")
        if self.rule_reward is not None:
            get_reward_function(self.rule_reward)
        if self.endpoint.constrained:
            self.rubric.score_regex()  # bounds it cannot constrain are a ConfigError when the run starts

    @classmethod
    def from_options(
        cls, options: dict[str, Any], router_address: str | None = None, router_model: str | None = None
    ) -> JudgeSettings:
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise ConfigError(
                f"unknown judge option(s) {unknown}; valid ones are {sorted(_OPTIONS)}."
                + did_you_mean(unknown[0], _OPTIONS)
            )
        rubric_options = {key: options[key] for key in _RUBRIC_OPTIONS[2:] if key in options}
        rubric = JudgeRubric(template=_rubric_template(options), **rubric_options)
        endpoint_options = {key: options[key] for key in _ENDPOINT_OPTIONS if key in options}
        url, model = _endpoint(options, router_address, router_model)
        endpoint = JudgeEndpoint(url=url, model=model, **endpoint_options)
        rest = {key: options[key] for key in _SETTINGS_OPTIONS if key in options}
        if "rule_reward_kwargs" in rest:
            rest["rule_reward_kwargs"] = dict(rest["rule_reward_kwargs"])
        return cls(rubric=rubric, endpoint=endpoint, **rest)


def _rubric_template(options: dict[str, Any]) -> str:
    if "rubric" in options and "rubric_path" in options:
        raise ConfigError("judge: give rubric (a template) or rubric_path (a file), not both")
    if "rubric_path" in options:
        path = Path(str(options["rubric_path"])).expanduser()
        try:
            return path.read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigError(f"judge rubric_path {str(path)!r} cannot be read: {error}") from error
    return str(options.get("rubric", DEFAULT_RUBRIC))


def _endpoint(options: dict[str, Any], router_address: str | None, router_model: str | None) -> tuple[str, str]:
    """The chat completions URL and model: the ``endpoint`` option's, else verl's reward-model router's."""
    if options.get("endpoint"):
        url = str(options["endpoint"]).rstrip("/")
        if not url.endswith("/chat/completions"):
            url += "/chat/completions"
        if not options.get("model"):
            raise ConfigError(f"judge endpoint {url!r} needs the model option (the name the endpoint serves)")
        return url, str(options["model"])
    if router_address is None:
        raise ConfigError(
            "judge_reward has no judge: enable verl's reward model (reward.reward_model.enable=True with "
            "reward.reward_model.model_path and its rollout) or give the endpoint and model options"
        )
    model = options.get("model") or router_model
    if not model:
        raise ConfigError("judge_reward: verl's reward router gave no model name; set the model option")
    return f"http://{router_address}/v1/chat/completions", str(model)


_PARSED: dict[str, JudgeSettings] = {}


def _settings(options: dict[str, Any], router_address: str | None, router_model: str | None) -> JudgeSettings:
    """Parsed once per process and configuration (the rubric compiles its template)."""
    key = json.dumps([options, router_address, router_model], sort_keys=True, default=repr)
    if key not in _PARSED:
        _PARSED[key] = JudgeSettings.from_options(options, router_address, router_model)
    return _PARSED[key]


@functools.lru_cache(maxsize=16)
def _client(endpoint: JudgeEndpoint) -> JudgeClient:
    """One client per endpoint and process: verl's reward worker calls the function once per trajectory, and the
    verdict cache lives in the client."""
    return JudgeClient(endpoint)


async def judge_reward(
    data_source: str,
    solution_str: str,
    ground_truth: object,
    extra_info: dict | None = None,
    reward_router_address: str | None = None,
    reward_model_tokenizer: Any = None,
    **options: Any,
) -> dict[str, float]:
    """The reward of one trajectory (module docstring); verl's ``compute_score`` signature."""
    options = {key: value for key, value in options.items() if key not in VERL_CALL_KWARGS}
    router_model = getattr(reward_model_tokenizer, "name_or_path", None)
    settings = _settings(options, reward_router_address, router_model)
    info = extra_info or {}
    context = info.get(JUDGE_CONTEXT_KEY)
    if not isinstance(context, JudgeContext):
        raise ConfigError(
            f"judge_reward needs the trajectory's question and images ({JUDGE_CONTEXT_KEY!r} in extra_info, got "
            f"{type(context).__name__}): set the mm_tool loop's judge_images option (all, none, named or last:N)"
        )
    answer = str(info.get(LAST_ASSISTANT_TEXT_KEY) or solution_str)
    result = await judge_answer(settings, context, ground_truth, answer)
    score = settings.judge_weight * result["judge_score"]
    if settings.rule_reward is not None:
        rule_function = get_reward_function(settings.rule_reward)
        rule = as_result_dict(
            rule_function(data_source, solution_str, ground_truth, info, **settings.rule_reward_kwargs)
        )
        result["rule_score"] = float(rule["score"])
        score += settings.rule_weight * result["rule_score"]
    return {**result, "score": score}


async def judge_answer(
    settings: JudgeSettings, context: JudgeContext, ground_truth: object, answer: str
) -> dict[str, float]:
    """The judge's verdict on ``answer`` as the fields ``judge_reward`` reports (``JUDGE_KEYS``, ``judge_mask``):
    ``judge_score`` is the score scaled to [0, 1], or ``fallback_score`` when the judge gave none."""
    answer = strip_template_leftovers(answer)
    messages = settings.rubric.messages(context, ground_truth, answer)
    key = verdict_key(settings.rubric, context, ground_truth, answer)
    verdict = await _client(settings.endpoint).judge(key, messages, settings.rubric)
    return _verdict_fields(verdict, settings)


def _verdict_fields(verdict: Verdict, settings: JudgeSettings) -> dict[str, float]:
    rubric = settings.rubric
    judged = verdict.status is VerdictStatus.JUDGED and verdict.score is not None
    if judged:
        scaled = (verdict.score - rubric.min_score) / (rubric.max_score - rubric.min_score)  # type: ignore[operator]
    else:
        scaled = settings.fallback_score
    return {
        "judge_score": float(scaled),
        "judge_judged": float(judged),
        "judge_unparseable": float(verdict.status is VerdictStatus.UNPARSEABLE),
        "judge_failed": float(verdict.status is VerdictStatus.FAILED),
        "judge_cached": float(verdict.cached),
        "judge_latency_s": float(verdict.latency_s),
        "judge_prompt_tokens": float(verdict.prompt.tokens),
        "judge_prompt_digest": float(verdict.prompt.digest),
        JUDGE_MASK_KEY: float(not judged and settings.on_failure == "mask"),
    }
