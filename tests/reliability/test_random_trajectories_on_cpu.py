"""1,000 seeded random trajectories through verl's AgentLoopWorker, in batches that each draw their own limits
(response length, turns, parallel calls, image count, pixel bounds, image-token budget and over-budget policy).
Each trajectory has random prompt images (sizes and modes), a scripted model that emits random tool calls (valid,
invalid, malformed, several per turn), answers and prose of random lengths, and sometimes an environment that
answers with images. After every trajectory the invariants hold, recomputed from the batch verl returns:
ids, mask and log-prob lengths agree and the trained tokens are exactly the server's; image placeholder runs equal
the processor's features per image; every tool image lies within the pixel budget, pre-sized so the processor keeps
it; the image count and token budget hold; every tool session and environment is closed exactly once; none is masked.
"""

from __future__ import annotations

import functools
import json
import math
import random
from collections import Counter
from dataclasses import dataclass

import pytest
from PIL import Image
from reliability_helpers import (
    ENV_LOG,
    PATCH,
    PicTool,
    grid_tokens,
    image_tools,
    marked_prompt,
    recorded,
    register_test_environments,
    row_of,
    run_batch,
    tool_image_pixels,
    trajectory_violations,
)

SEED = 20_251_126
BATCHES, PER_BATCH = 8, 125  # 1,000 trajectories
PROCESSOR_MIN_PIXELS, PROCESSOR_MAX_PIXELS = 784, 50176  # the tiny Qwen2.5-VL processor's bounds
FACTOR = 28
TOOL_NAMES = ["rotate", "flip", "crop", "zoom_in", "draw_bbox", "draw_line", "pic"]
PROMPT_MODES = ["RGB", "L", "RGBA", "P", "CMYK", "LA", "1"]
PIC_MODES = ["RGB", "L", "RGBA", "P", "CMYK", "LA", "1", "I;16", "I", "F"]
STOP_REASONS = {"answered", "turn_limit", "length_limit", "budget"}


@dataclass(frozen=True)
class Limits:
    """One batch's random configuration."""

    response_length: int
    max_turns: int
    max_parallel_calls: int
    max_tool_response_length: int
    loop_options: dict

    @property
    def pixel_bounds(self) -> tuple[int, int]:
        low = max(self.loop_options.get("min_pixels") or 0, PROCESSOR_MIN_PIXELS)
        return low, min(self.loop_options.get("max_pixels") or PROCESSOR_MAX_PIXELS, PROCESSOR_MAX_PIXELS)


def draw_limits(rng: random.Random, batch_index: int) -> Limits:
    """Random limits; the over-budget policies take turns, so each meets exhausted budgets."""
    options = {
        "max_images": rng.randint(2, 6),
        "over_budget": ("downscale", "refuse", "stop")[batch_index % 3],
        "annotate_image_ids": rng.random() < 0.7,
    }
    if rng.random() < 0.5:
        options["max_pixels"] = rng.randint(2 * 784, PROCESSOR_MAX_PIXELS)
    if rng.random() < 0.3:
        options["min_pixels"] = rng.randint(784, min(8 * 784, options.get("max_pixels", PROCESSOR_MAX_PIXELS)))
    return Limits(
        rng.choice([96, 384, 768, 1024, 1536]), rng.randint(1, 8), rng.randint(1, 3), rng.choice([24, 80, 256]), options
    )


# ----- random samples ----------------------------------------------------------------------------------------------


def random_size(rng: random.Random, largest: int, max_ratio: float) -> tuple[int, int]:
    """A log-uniform size with an aspect ratio of at most ``max_ratio``."""
    while True:
        width, height = (max(1, round(math.exp(rng.uniform(0, math.log(largest))))) for _ in range(2))
        if max(width, height) / min(width, height) <= max_ratio:
            return width, height


def prompt_image(rng: random.Random) -> Image.Image:
    image = Image.new("RGB", random_size(rng, 400, 100), tuple(rng.randrange(256) for _ in range(3)))
    return image.convert(rng.choice(PROMPT_MODES))


def random_call(rng: random.Random, tools: list[str]) -> dict:
    name = rng.choice(tools if rng.random() < 0.9 else TOOL_NAMES)
    coordinate = lambda: rng.choice([rng.randint(-50, 450), round(rng.uniform(-50, 450), 2)])  # noqa: E731
    arguments = {
        "rotate": lambda: {"degrees": rng.choice([90, -90, 180, rng.uniform(-400, 400)])},
        "flip": lambda: {"direction": rng.choice(["horizontal", "vertical", "diagonal"])},
        "draw_line": lambda: {"x1": coordinate(), "y1": coordinate(), "x2": coordinate(), "y2": coordinate()},
        "pic": lambda: dict(zip(("w", "h"), random_size(rng, 1500, 300)), mode=rng.choice(PIC_MODES)),
    }.get(name, lambda: _box(rng, coordinate))()
    if name != "pic" and rng.random() < 0.4:
        arguments["image_id"] = rng.choice([1, 1, 2, 2, 3, 0, 7])
    return {"name": name, "arguments": arguments}


def _box(rng: random.Random, coordinate) -> dict:
    x1, x2 = sorted((coordinate(), coordinate())) if rng.random() < 0.85 else (coordinate(), coordinate())
    y1, y2 = sorted((coordinate(), coordinate())) if rng.random() < 0.85 else (coordinate(), coordinate())
    box = {"x1": x1, "y1": y1, "x2": x2, "y2": y2}
    if rng.random() < 0.3:
        box["label"] = rng.choice(["cat", "x" * 80])
    return box


def prose(rng: random.Random, longest: int) -> str:
    words = ["the", "image", "shows", "a", "red", "square", "rotated", "by", "ninety", "degrees", "so", "I", "zoom"]
    return " ".join(rng.choice(words) for _ in range(rng.randint(0, longest)))


def random_turn(rng: random.Random, tools: list[str]) -> str:
    pick = rng.random()
    if pick < 0.6:
        calls = [json.dumps(random_call(rng, tools)) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
        return prose(rng, 8) + "".join(f"<tool_call>\n{call}\n</tool_call>" for call in calls) + "<|im_end|>"
    if pick < 0.67:
        return prose(rng, 5) + rng.choice(["<tool_call>\n{broken\n</tool_call>", "<tool_call>{}"]) + "<|im_end|>"
    if pick < 0.93:
        return f"{prose(rng, 30)}<answer>{rng.randint(0, 359)}</answer><|im_end|>"
    return prose(rng, 400) + "<|im_end|>"


@dataclass
class Sample:
    prompt: list
    turns: list[str]
    env: dict | None
    prompt_images: int
    tools: list[str]  # its tool_selection: three tools, so prompts stay short


def random_sample(index: int, rng: random.Random, limits: Limits) -> Sample:
    images = [prompt_image(rng) for _ in range(rng.randint(0, min(2, limits.loop_options["max_images"])))]
    env = None
    if rng.random() < 0.25:
        size = list(random_size(rng, 600, 50)) if rng.random() < 0.6 else None
        env = {"name": "reliability_counting", "answers": rng.randint(1, 3), "image_size": size}
    tools = rng.sample(TOOL_NAMES, 3)
    turns = [random_turn(rng, tools) for _ in range(limits.max_turns + 1)]
    return Sample(marked_prompt(index, prose(rng, 8), images), turns, env, len(images), tools)


# ----- one batch ---------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def processor_of(model_dir):
    from verl.utils import hf_processor

    return hf_processor(str(model_dir))


def prompt_tokens(processor, sample: Sample) -> int:
    """Image tokens of a prompt's images as verl will size them (qwen_vl_utils, then the processor)."""
    from qwen_vl_utils import fetch_image

    from verl_mm_tools.tokens import processor_image_tokens

    images = [item["image"] for item in sample.prompt[0]["content"] if item.get("type") == "image"]
    return sum(processor_image_tokens(processor, fetch_image({"image": image})) for image in images)


def run_random_batch(tiny_model_dir, workdir, batch_index: int):
    rng = random.Random(SEED * 1000 + batch_index)
    limits = draw_limits(rng, batch_index)
    samples = [random_sample(index, random.Random(rng.random()), limits) for index in range(PER_BATCH)]
    tools, lifecycle = recorded([*image_tools(), PicTool()])
    if rng.random() < 0.75:  # an image-token budget every prompt fits, with 0 to 40 tokens to spare for tools
        most = max(prompt_tokens(processor_of(tiny_model_dir), sample) for sample in samples)
        limits.loop_options["max_image_tokens"] = max(1, most + rng.randint(0, 40))
    columns = {
        "tools_kwargs": [{tool.name: {"create_kwargs": {"sample": i}} for tool in tools} for i in range(PER_BATCH)],
        "extra_info": [{"index": i, "env": s.env, "tool_selection": s.tools} for i, s in enumerate(samples)],
    }
    extra = [
        f"actor_rollout_ref.rollout.multi_turn.max_parallel_calls={limits.max_parallel_calls}",
        f"actor_rollout_ref.rollout.multi_turn.max_tool_response_length={limits.max_tool_response_length}",
    ]
    batch = run_batch(
        tiny_model_dir,
        workdir,
        tools=tools,
        prompts=[s.prompt for s in samples],
        script=lambda sample, turn, images: samples[sample].turns[min(turn, limits.max_turns)],
        columns=columns,
        loop_options=limits.loop_options,
        prompt_length=1024,
        response_length=limits.response_length,
        max_turns=limits.max_turns,
        extra=extra,
    )
    return limits, samples, batch, lifecycle


def budget_violations(batch, index: int, sample: Sample, limits: Limits) -> list[str]:
    row = row_of(batch.output, index)
    low, high = limits.pixel_bounds
    problems = [
        f"tool image of {pixels} px outside [{low}, {high}]"
        for pixels in tool_image_pixels(row, sample.prompt_images)
        if not low <= pixels <= high
    ]
    if len(row.grid) > limits.loop_options["max_images"]:
        problems.append(f"{len(row.grid)} images, more than max_images={limits.loop_options['max_images']}")
    budget = limits.loop_options.get("max_image_tokens")
    if budget is not None and sum(grid_tokens(row.grid)) > budget:
        problems.append(f"{sum(grid_tokens(row.grid))} image tokens, more than max_image_tokens={budget}")
    shown = batch.server.generations[index][-1].images if batch.server.generations[index] else []
    for (_, h, w), image in list(zip(row.grid, shown))[sample.prompt_images :]:
        if image.size != (w * PATCH, h * PATCH) or image.width % FACTOR or image.height % FACTOR:
            problems.append(f"tool image of {image.size} was resized again by the processor to {w * PATCH}x{h * PATCH}")
    return problems


def batch_violations(limits: Limits, samples: list[Sample], batch, lifecycle) -> dict[int, list[str]]:
    found = {}
    for index, sample in enumerate(samples):
        problems = trajectory_violations(batch, index) + budget_violations(batch, index, sample, limits)
        if batch.field("mm_tool/masked")[index]:
            problems.append(f"masked: {batch.field('mm_tool/error')[index]}")
        if "cannot be decoded" in batch.worker.tokenizer.decode(batch.output.batch["responses"][index]):
            problems.append("a sound tool image was refused as undecodable")
        if batch.field("mm_tool/stop_reason")[index] not in STOP_REASONS:
            problems.append(f"stop reason {batch.field('mm_tool/stop_reason')[index]!r}")
        if len(batch.server.generations[index]) > limits.max_turns:
            problems.append(f"{len(batch.server.generations[index])} assistant turns, max_turns={limits.max_turns}")
        if batch.field("tool_call_counts")[index] != lifecycle.executed.get(index, 0):
            problems.append(
                f"tool_call_counts={batch.field('tool_call_counts')[index]}, executed "
                f"{lifecycle.executed.get(index, 0)}"
            )
        if problems:
            found[index] = problems
    return found


@pytest.fixture(scope="module")
def random_batches(tiny_model_dir, tmp_path_factory):
    register_test_environments()
    results = []
    for batch_index in range(BATCHES):
        ENV_LOG.reset.clear(), ENV_LOG.closed.clear()
        limits, samples, batch, lifecycle = run_random_batch(
            tiny_model_dir, tmp_path_factory.mktemp("random"), batch_index
        )
        envs = (sorted(ENV_LOG.reset), sorted(ENV_LOG.closed))
        results.append((limits, samples, batch, lifecycle, envs))
    return results


def test_a_thousand_random_trajectories_keep_every_invariant(random_batches):
    trajectories, stops, events = 0, Counter(), Counter()
    for limits, samples, batch, lifecycle, _ in random_batches:
        violations = batch_violations(limits, samples, batch, lifecycle)
        assert violations == {}, (limits, {i: (v, samples[i].turns) for i, v in list(violations.items())[:3]})
        trajectories += len(samples)
        stops.update(batch.field("mm_tool/stop_reason"))
        for key in ("budget_refusals", "budget_downscales", "dropped_turns", "invalid_actions", "tool_errors"):
            events[key] += sum(batch.field(f"mm_tool/{key}"))
    assert trajectories == 1000
    assert set(stops) == STOP_REASONS  # the random limits reach every way a trajectory can end ...
    assert min(events.values()) > 0, events  # ... and every budget decision, dropped turns and invalid calls


def test_every_tool_session_and_environment_is_closed_exactly_once(random_batches):
    for _, samples, _, lifecycle, (reset, closed) in random_batches:
        assert lifecycle.leaks() == []
        assert reset == closed == [index for index, sample in enumerate(samples) if sample.env]
