"""Units of the mm_tool loop: option parsing, the image budget's sizing rules, trajectory invariants."""

from __future__ import annotations

import pytest
from PIL import Image

from verl_mm_tools.agent_loop.budget import ImageBudget, ImageGeometry, Verdict
from verl_mm_tools.agent_loop.config import MMToolLoopConfig
from verl_mm_tools.agent_loop.validation import placeholder_runs, trajectory_problems
from verl_mm_tools.errors import ConfigError, ImageBudgetError
from verl_mm_tools.tokens import processor_image_tokens

TINY = ImageGeometry(patch_size=14, merge_size=2, min_pixels=28 * 28, max_pixels=64 * 28 * 28)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_images": 0}, "max_images must be a positive integer, got 0"),
        ({"max_images": True}, "max_images must be a positive integer, got True"),
        ({"min_pixels": 5000, "max_pixels": 4000}, r"min_pixels \(5000\) must be <= max_pixels \(4000\)"),
        ({"over_budget": "shrink"}, "over_budget must be one of"),
        ({"tool_timeout_s": float("nan")}, "tool_timeout_s must be a positive number of seconds, got nan"),
        ({"max_images": 9}, r"max_images=9 exceeds actor_rollout_ref.rollout.limit_images=8"),
        ({"keep_last_images": 0}, "keep_last_images must be a positive integer, got 0"),
        (
            {"keep_last_images": 2, "export": "per_trajectory"},
            "keep_last_images=2 with export=per_trajectory: one sample is the conversation as generated",
        ),
    ],
)
def test_invalid_options_are_refused_with_what_was_received(options, message):
    with pytest.raises(ConfigError, match=message):
        MMToolLoopConfig.from_options(options, limit_images=8)


def test_defaults_and_limit_images():
    assert MMToolLoopConfig.from_options({}, limit_images=None).max_images == 16
    assert MMToolLoopConfig.from_options({}, limit_images=5).max_images == 5
    assert MMToolLoopConfig.from_options({"max_images": None}, limit_images=None) == MMToolLoopConfig()


def test_keep_last_images_chooses_a_multi_sample_export_unless_one_is_named():
    assert MMToolLoopConfig.from_options({"keep_last_images": 2}, limit_images=None).export.value == "auto"
    named = MMToolLoopConfig.from_options({"keep_last_images": 2, "export": "per_turn"}, limit_images=None)
    assert named.export.value == "per_turn"
    assert MMToolLoopConfig.from_options({}, limit_images=None).export.value == "per_trajectory"


def test_geometry_reads_the_processor_and_overrides(tiny_processor):
    assert ImageGeometry.from_processor(tiny_processor) == TINY
    # transformers 5's Qwen-VL processor resizes with min_pixels and max_pixels only when both are given
    both = ImageGeometry.from_processor(tiny_processor, {"min_pixels": 784, "max_pixels": 3136})
    assert (both.min_pixels, both.max_pixels) == (784, 3136)
    assert ImageGeometry.from_processor(tiny_processor, {"max_pixels": 3136}) == TINY


@pytest.mark.parametrize(
    ("size", "tokens"),
    [((56, 56), 4), ((84, 56), 6), ((10, 10), 1), ((1000, 1000), 64), ((2000, 100), 35)],
)
def test_geometry_token_counts_match_the_processor(tiny_processor, size, tokens):
    assert TINY.tokens(*size) == tokens
    assert processor_image_tokens(tiny_processor, Image.new("RGB", size)) == tokens


def test_budget_sizes_tool_images_like_the_processor_and_downscales_to_fit():
    budget = ImageBudget(MMToolLoopConfig(max_image_tokens=10), TINY)
    budget.admit_prompt_images([Image.new("RGB", (84, 56))])
    big = budget.admit(Image.new("RGBA", (1000, 1000)))
    assert big.verdict is Verdict.DOWNSCALED and big.image.size == (56, 56)
    assert big.note == "the image was downscaled to 56x56 px to fit the image token budget"
    assert big.image.mode == "RGB" and big.tokens == 4 and budget.tokens == 10
    assert budget.admit(Image.new("RGB", (56, 56))).note.startswith("the image token budget is exhausted (0 image")


def test_a_window_budgets_the_images_in_context():
    """keep_last_images=2: the budget counts the last two images, so a long trajectory keeps admitting; without the
    window the second tool image is already over max_image_tokens."""
    config = {"max_images": 2, "max_image_tokens": 8}
    windowed = ImageBudget(MMToolLoopConfig(**config, keep_last_images=2, export="auto"), TINY)
    windowed.admit_prompt_images([Image.new("RGB", (56, 56))])  # 4 tokens
    sizes = [(56, 56), (56, 84), (56, 84)]  # 4, 6 and 6 tokens
    admissions = [windowed.admit(Image.new("RGB", size)) for size in sizes]
    # the second: 4 tokens left beside the previous image, downscaled to 2; the third: 6 left beside that one
    assert [(a.verdict, a.tokens) for a in admissions] == [
        (Verdict.ADMITTED, 4),
        (Verdict.DOWNSCALED, 2),
        (Verdict.ADMITTED, 6),
    ]
    assert windowed.charged == [4, 4, 2, 6] and (windowed.images, windowed.tokens) == (2, 8)
    windowed.truncate(2)  # a dropped turn's images leave the count
    assert windowed.charged == [4, 4] and (windowed.images, windowed.tokens) == (2, 8)
    whole = ImageBudget(MMToolLoopConfig(**config), TINY)
    whole.admit_prompt_images([Image.new("RGB", (56, 56))])
    assert [whole.admit(Image.new("RGB", (56, 56))).verdict for _ in range(2)] == [Verdict.ADMITTED, Verdict.REFUSED]
    assert (whole.images, whole.tokens) == (2, 8)


def test_budget_never_copies_an_image_that_already_fits():
    image = Image.new("RGB", (56, 84))
    assert ImageBudget(MMToolLoopConfig(), TINY).admit(image).image is image


@pytest.mark.parametrize(
    ("image", "refusal"),
    [
        (Image.new("RGB", (20000, 20)), "the tool produced an image of 20000x20 px that cannot be shown"),
        (Image.new("RGB", (56, 56)), "the image budget is exhausted (at most 1 image per conversation)"),
    ],
)
def test_budget_refuses_what_cannot_be_shown(image, refusal):
    budget = ImageBudget(MMToolLoopConfig(max_images=1), TINY)
    if image.size == (56, 56):
        budget.admit_prompt_images([Image.new("RGB", (28, 28))])
    admission = budget.admit(image)
    assert admission.verdict is Verdict.REFUSED
    assert admission.image is None and admission.note.startswith(refusal)


def test_over_budget_stop_is_the_budgets_verdict():
    budget = ImageBudget(MMToolLoopConfig(max_images=1, over_budget="stop"), TINY)
    budget.admit_prompt_images([Image.new("RGB", (28, 28))])
    stop = budget.admit(Image.new("RGB", (56, 56)))
    assert (stop.verdict, stop.image, budget.images) == (Verdict.STOP, None, 1)
    assert stop.note == (
        "the image budget is exhausted (at most 1 image per conversation); no further images can be shown"
    )


def test_placeholder_runs_and_problems():
    assert placeholder_runs([5, 12, 12, 7, 12, 9, 12, 12, 12], 12) == [2, 1, 3]
    problems = trajectory_problems(
        prompt_ids=[1, 12, 12],
        response_ids=[3, 12, 4],
        response_mask=[1, 1],
        response_logprobs=[0.0],
        image_tokens=[2, 2],
        image_token_id=12,
        forbidden_generated=frozenset({12}),
    )
    assert problems == [
        "response_mask has 2 entries for 3 response tokens",
        "response_logprobs has 1 entries for 3 tokens",
        "image placeholder runs [2, 1] do not match the processor's tokens per image [2, 2]",
        "the model generated vision placeholder tokens [12]",
    ]


def test_a_prompt_over_the_budget_fails_its_trajectory_with_what_to_change():
    budget = ImageBudget(MMToolLoopConfig(max_images=1), TINY)
    with pytest.raises(ImageBudgetError, match=r"^the prompt holds 2 images, more than max_images=1; raise the mm"):
        budget.admit_prompt_images([Image.new("RGB", (28, 28))] * 2)
