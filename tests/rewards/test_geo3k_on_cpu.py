"""geo3k answer check: verl parity, template leftovers, and the fallback grader without mathruler."""

from __future__ import annotations

import importlib.util

import pytest

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.rewards import geo3k as geo3k_module
from verl_mm_tools.rewards import geo3k_reward

HAS_MATHRULER = importlib.util.find_spec("mathruler") is not None


@pytest.fixture(params=["verl_geo3k", "fallback"])
def grader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run each case with verl's geo3k grading (needs mathruler) and with the fallback grader."""
    if request.param == "verl_geo3k" and not HAS_MATHRULER:
        pytest.skip("mathruler is not installed")
    if request.param == "fallback":
        monkeypatch.setattr(geo3k_module, "_verl_geo3k", lambda: None)
    return request.param


# (response, ground truth, score, acc, format_ok)
CASES = [
    (r"<think>angles sum</think> so \boxed{3}", "3", 1.0, 1.0, 1.0),
    (r"<think>x</think> \boxed{3}<|im_end|>", "3", 1.0, 1.0, 1.0),
    ("\n<think>x</think>\n\\boxed{3}\n<|endoftext|>\n", "3", 1.0, 1.0, 1.0),
    (r"\boxed{3}", "3", 0.9, 1.0, 0.0),
    (r"<think>x</think> \boxed{4}", "3", 0.1, 0.0, 1.0),
    (r"<think>x</think> \boxed{2\sqrt{3}}", r"2\sqrt{3}", 1.0, 1.0, 1.0),
    (r"<think>x</think> \boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0, 1.0, 1.0),
    (r"\boxed{1} first, then \boxed{5}", "5", 0.9, 1.0, 0.0),
    ("<think>x</think> the answer is 3", "3", 0.0, 0.0, 0.0),
    ("", "3", 0.0, 0.0, 0.0),
]


@pytest.mark.parametrize(("response", "truth", "score", "acc", "format_ok"), CASES)
def test_geo3k_reward_table(grader: str, response: str, truth: str, score: float, acc: float, format_ok: float) -> None:
    result = geo3k_reward("hiyouga/geometry3k", response, truth)
    assert result == {"score": pytest.approx(score), "acc": acc, "format_ok": format_ok}


@pytest.mark.skipif(not HAS_MATHRULER, reason="mathruler is not installed")
@pytest.mark.parametrize(("response", "truth"), [(r"<think>x</think> \boxed{3}", "3"), (r"\boxed{4}", "3")])
def test_matches_verl_geo3k_on_clean_text(response: str, truth: str) -> None:
    from verl.utils.reward_score import geo3k

    assert geo3k_reward("g", response, truth)["score"] == pytest.approx(geo3k.compute_score(response, truth))


def test_format_weight_and_use_boxed(grader: str) -> None:
    assert geo3k_reward("g", r"\boxed{3}", "3", format_weight=0.0)["score"] == 1.0
    assert geo3k_reward("g", r"<think>x</think>\boxed{4}", "3", format_weight=1.0)["score"] == 1.0
    assert geo3k_reward("g", "3<|im_end|>", "3", use_boxed=False)["acc"] == 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"format_weight": 1.5}, r"\[0, 1\], got 1.5"), ({"format_score": 0.1}, r"Did you mean 'format_weight'")],
)
def test_geo3k_config_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        geo3k_reward("g", r"\boxed{3}", "3", **kwargs)
