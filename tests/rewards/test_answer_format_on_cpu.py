"""Format reward: which responses are well-formed, and why not."""

from __future__ import annotations

import pytest

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.rewards import format_reward

# (response, tunables, reason); score is 1.0 exactly when reason == "ok"
CASES = [
    ("<answer>90</answer>", {}, "ok"),
    ("  reasoning first <answer>90</answer>\n<|im_end|>\n", {}, "ok"),
    ("<ANSWER>90</ANSWER>", {}, "ok"),
    ("90", {}, "no <answer>...</answer> block"),
    ("<answer>90", {}, "unbalanced or nested <answer> tags"),
    ("<answer><answer>90</answer></answer>", {}, "unbalanced or nested <answer> tags"),
    ("<answer>  </answer>", {}, "empty <answer> block"),
    ("<answer>1</answer> <answer>2</answer>", {}, "2 <answer> blocks, expected one"),
    ("<answer>1</answer> <answer>2</answer>", {"allow_multiple": True}, "ok"),
    ("<answer>90</answer> because", {}, "text after </answer>"),
    ("<answer>90</answer> because", {"answer_last": False}, "ok"),
    ("<answer>ninety</answer>", {"numeric": True}, "<answer> block does not hold exactly one number"),
    ("<answer>90 or 180</answer>", {"numeric": True}, "<answer> block does not hold exactly one number"),
    ("<answer>90°</answer>", {"numeric": True}, "ok"),
    ("<think>hmm</think><answer>90</answer>", {"require_think": True}, "ok"),
    ("<answer>90</answer>", {"require_think": True}, "no <think>...</think> block before <answer>"),
    ("<think> </think><answer>90</answer>", {"require_think": True}, "no <think>...</think> block before <answer>"),
    ("<final>3</final>", {"tag": "final"}, "ok"),
]


@pytest.mark.parametrize(("response", "tunables", "reason"), CASES)
def test_format_reward_table(response: str, tunables: dict, reason: str) -> None:
    score = 1.0 if reason == "ok" else 0.0
    assert format_reward("any", response, None, **tunables) == {"score": score, "format_ok": score, "reason": reason}


@pytest.mark.parametrize(
    ("tunables", "message"),
    [
        ({"tag": "<answer>"}, r"tag name like 'answer'.*got '<answer>'"),
        ({"numerical": True}, r"Did you mean 'numeric'"),
    ],
)
def test_format_reward_config_errors(tunables: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        format_reward("any", "<answer>1</answer>", None, **tunables)


@pytest.mark.parametrize(
    ("response", "ground_truth", "kwargs", "expected"),
    [
        ("<answer>7</answer><|im_end|>", "7", {}, (1.0, "ok")),
        ("I think <answer> 7 </answer>", 7, {}, (1.0, "ok")),
        ("<answer>4</answer> then <answer>7</answer>", "7", {}, (1.0, "ok")),
        ("<answer>Seven</answer>", "seven", {}, (1.0, "ok")),
        ("<answer>Seven</answer>", "seven", {"case_sensitive": True}, (0.0, "wrong answer")),
        ("7", "7", {}, (0.0, "no <answer>...</answer> block")),
        (" Blue<|im_end|>", "blue", {"require_tag": False}, (1.0, "ok")),
        ("blue blue", "blue", {"require_tag": False}, (0.0, "wrong answer")),
        ("red <answer>blue</answer>", "blue", {"require_tag": False}, (1.0, "ok")),  # a block still wins
        ("answer>blue</answer>", "blue", {"require_tag": False}, (0.0, "wrong answer")),
    ],
)
def test_exact_answer_reward(response, ground_truth, kwargs, expected):
    from verl_mm_tools.rewards import exact_answer_reward

    result = exact_answer_reward("verl_mm_tools/zoom", response, ground_truth, **kwargs)
    assert (result["score"], result["reason"]) == expected
    assert result["acc"] == result["score"]
