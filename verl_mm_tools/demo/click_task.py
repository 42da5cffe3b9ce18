"""The demo's GUI task (``demo --task click``): MiniWoB++'s click-test in headless Chromium, on a coarse grid.

click-test shows one square button, 35 to 99 px wide, at a random place in its 160x160 px task area. A tiny model
from a random start cannot be expected to point anywhere in 160x160 px, so the task is its nearest honest variant: the
episodes are the seeds whose button covers exactly one of four points near the centres of the area's quadrants
(``POINTS``), as many for each point. The button is painted red (the environment's ``high_contrast``: same page,
boxes, clicks and reward), the variant the tiny model can localize (docs/experiments/gui_click.md, session 44).

The cold start clicks those points only, demonstrations with mistakes: of each screenshot's demonstrations,
``true_click_share`` click the covered point and the rest each point equally often, so they hit in 0.8 + 0.2 / 4 =
0.85 of them; the fit draws among them at every pick, so its mistakes are not tied to a screenshot and its policy
leaves GRPO groups that hit and miss (``ClickColdStart``). The task's tiny model is a Qwen3-VL (``DemoTask.family``):
its vision tower adds a position embedding to each patch and its M-RoPE interleaves height and width over all
frequencies, and its fits localized the button on both axes on every seed tried. The tiny Qwen2.5-VL, whose tower has
no absolute position and whose M-RoPE gives the image's width its lowest frequencies only, found one axis or none on
half of them, even with its image tokens 30x larger (docs/experiments/gui_click.md, sessions 45-48). Its share on
held-out screenshots must be above chance before RL (``HELD_OUT_SHARE_FLOOR``), and RL's part is to raise the hits
past the demonstrations'.

An episode is one action (``max_actions: 1``; a click that misses does not end click-test) scored by MiniWoB's success
(``reward: success``): 1 when the click hits, 0 when it misses; a trajectory cut before it acted (turn or length
limit) scores -1 (``environment_reward``'s unfinished). The clicks, the page and the reward are the real ones: the
model writes the click tool's call in the pixels of the screenshot it was shown, and Chromium decides the hit.

On the plain grey-on-white button the tiny model's success stayed at chance (docs/experiments/gui_click.md).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from verl_mm_tools.compact_image import expanded_inputs
from verl_mm_tools.data.miniwob import VAL_SEED_OFFSET, miniwob_row
from verl_mm_tools.demo.fit import collate, fit, model_inputs, one_thread
from verl_mm_tools.errors import ColdStartError

if TYPE_CHECKING:
    from PIL import Image
    from transformers import PreTrainedModel
    from verl.protocol import DataProto

logger = logging.getLogger(__name__)

TASK = "click-test"
# Near the task area's quadrant centres, in page px (the 160x210 page: MiniWoB's 50 px instruction bar, then the
# area). Shown at 160x224 (Qwen3-VL's 32 px tokens) they are x 40 or 125, y 96 or 181 (at Qwen2.5-VL's 168x224: x 42
# or 131): the tokenizer writes digits one by one, and with x 126 (page 120) the two x values shared their second
# digit ("42", "126"), after which the cold-started model often wrote the other's ending ("12", "426": 12 of 32 first
# clicks of a run); here the values part at each digit.
POINTS = ((40, 90), (125, 90), (40, 170), (125, 170))
# A point counts as covered when it lies this far inside the button's edges: a click there lands on it
INSIDE_MARGIN = 3
ENV = {"name": "miniwob", "task": TASK, "reward": "success", "max_actions": 1, "high_contrast": True}
IMAGE_TOKEN = "<|image_pad|>"  # the warm start's families write hermes calls: Qwen's placeholder (demo.demonstrations)
DEMO_SEED_START = 7_000_001  # demonstrations come from seeds no training or validation row holds
# A demonstration's click runs after its first turn and ends the episode; at the turn limit verl stops a turn before
# its tools run, so one turn would never click
DEMONSTRATION_TURNS = 2
SEEDS_PER_DEMO_SEED = 100_000  # the seed ranges of two demo seeds do not overlap
SEEDS_SCANNED_PER_EPISODE = 100  # about 2.3 seeds give an episode; a scan this long means the page is not click-test's


Box = tuple[float, float, float, float]  # left, top, width, height in page px


@dataclass(frozen=True)
class ClickEpisode:
    """A click-test episode of the task: its seed, its button's box, and the one point (index into ``POINTS``) the
    button covers."""

    seed: int
    box: Box
    point: int


def covered_points(box: Box, margin: float = INSIDE_MARGIN) -> list[int]:
    """The ``POINTS`` (their indices) at least ``margin`` px inside the button ``box`` (left, top, width, height in
    page px); a negative margin counts points that far outside too."""
    left, top, width, height = box
    return [
        index
        for index, (x, y) in enumerate(POINTS)
        if left + margin <= x <= left + width - margin and top + margin <= y <= top + height - margin
    ]


def clear_point(box: Box) -> int | None:
    """The one point the button covers, when no other point is within ``INSIDE_MARGIN`` px of it (a click there
    might land on its edge); None otherwise."""
    inside, near = covered_points(box), covered_points(box, -INSIDE_MARGIN)
    return inside[0] if len(inside) == 1 and near == inside else None


def button_box(observation: dict[str, Any]) -> Box:
    """The click-test button's box (left, top, width, height) in page px, from MiniWoB's DOM."""
    buttons = [element for element in observation["dom_elements"] if element["tag"] == "button"]
    if len(buttons) != 1:
        raise RuntimeError(f"click-test shows one button; its DOM held {len(buttons)}")
    return tuple(float(buttons[0][key][0]) for key in ("left", "top", "width", "height"))  # type: ignore[return-value]


def click_episodes(count: int, first_seed: int, exclude: Collection[Box] = ()) -> list[ClickEpisode]:
    """``count`` episodes (``count / 4`` per point, the rest to the first points), from the seeds ``first_seed``, ...
    whose button covers exactly one point clearly (``clear_point``), each button box once and none in ``exclude``
    (the same box is the same screenshot): read from the page in a headless browser."""
    return asyncio.run(_click_episodes(count, first_seed, exclude))


async def _click_episodes(count: int, first_seed: int, exclude: Collection[Box]) -> list[ClickEpisode]:
    from verl_mm_tools.envs import Sample
    from verl_mm_tools.envs.gui.miniwob_env import MiniWoBEnv

    wanted = [count // len(POINTS) + (index < count % len(POINTS)) for index in range(len(POINTS))]
    found: list[ClickEpisode] = []
    boxes: set[Box] = set(exclude)
    seed = first_seed
    while len(found) < count:
        if seed - first_seed >= SEEDS_SCANNED_PER_EPISODE * count:
            raise RuntimeError(
                f"click-test: {len(found)} of {count} episodes found in seeds {first_seed}-{seed - 1} (per point still "
                f"wanted: {wanted}); has miniwob's click-test page changed?"
            )
        env = MiniWoBEnv(TASK)  # one episode each; its browser goes back to the pool and serves the next
        try:
            await env.reset(Sample(data_source=None, ground_truth=None, extra_info={"seed": seed}))
            box = button_box(env.observation)
        finally:
            await env.close()
        point = clear_point(box)
        if point is not None and wanted[point] and box not in boxes:
            wanted[point] -= 1
            boxes.add(box)
            found.append(ClickEpisode(seed, box, point))
        seed += 1
    return found


def click_row(episode: ClickEpisode, split: str, index: int) -> dict:
    """``make-data miniwob``'s row of the episode, with the task's environment (one action, the success reward) and
    the point its button covers (for reading the results; nothing scores with it)."""
    row = miniwob_row(TASK, episode.seed, split, index)
    row["extra_info"].update(env=dict(ENV), target_point=episode.point)
    return row


def write_click_dataset(out_dir: Path, *, train_size: int, val_size: int, seed: int) -> tuple[Path, Path]:
    """The task's ``train.parquet`` and ``val.parquet`` under ``out_dir`` (the demo's ``DatasetWriter``): balanced
    episodes from seeds ``seed * SEEDS_PER_DEMO_SEED`` on (validation: from ``VAL_SEED_OFFSET`` on as well)."""
    from verl_mm_tools.data.common import write_parquet
    from verl_mm_tools.envs.gui.miniwob_env import POOL

    start = seed * SEEDS_PER_DEMO_SEED

    def rows(split: str, size: int, first_seed: int) -> list[dict]:
        episodes = interleaved(click_episodes(size, first_seed))
        return [click_row(episode, split, index) for index, episode in enumerate(episodes)]

    try:
        return (
            write_parquet(rows("train", train_size, start), out_dir / "train.parquet"),
            write_parquet(rows("val", val_size, VAL_SEED_OFFSET + start), out_dir / "val.parquet"),
        )
    finally:
        POOL.close_all()  # no browser of the demo's own waits idle while the trainer runs


def interleaved(episodes: Sequence[ClickEpisode]) -> list[ClickEpisode]:
    """The episodes with their points in turn (0, 1, 2, 3, 0, ...): every batch of four rows holds each point once
    (the demo's data is not shuffled)."""
    by_point = [[episode for episode in episodes if episode.point == point] for point in range(len(POINTS))]
    rounds = max(len(group) for group in by_point)
    return [group[turn] for turn in range(rounds) for group in by_point if turn < len(group)]


def rollout_inputs(rows: Sequence[dict]) -> tuple[list[list[dict]], dict[str, list]]:
    """The prompts and columns of ``rows`` as ``LocalRollout.run`` takes them."""
    columns = {key: [row[key] for row in rows] for key in ("data_source", "reward_model", "extra_info")}
    return [row["prompt"] for row in rows], columns


def click_call(point: int, images: Sequence[Image.Image]) -> str:
    """The click tool's call on ``POINTS[point]``, in the pixels of the latest screenshot shown (as the oracle
    writes it)."""
    from verl_mm_tools.envs.gui.miniwob_env import ACTIVE_EPISODE
    from verl_mm_tools.envs.gui.screen import shown_size
    from verl_mm_tools.runtime.scripted_client import tool_call_text

    env = ACTIVE_EPISODE.get()
    if env is None:
        raise RuntimeError("click_call answers trajectories of the miniwob environment only (no episode is active)")
    shown = shown_size(images, env.screen_token)
    x, y = POINTS[point]
    return tool_call_text("click", x=int(x * shown[0] / env.page_size[0]), y=int(y * shown[1] / env.page_size[1]))


# The demonstrations' rollout scores with MiniWoB's reward alone (no discount): a hit 1.0, a miss 0.0
REWARD_OVERRIDES = ("reward.reward_manager.name=mm_turn_discount", "+reward.reward_kwargs.gamma=1.0")


def demonstration_rollout(
    model_dir: Path, tools_yaml: Path, episodes: Sequence[ClickEpisode], clicks: Sequence[int]
) -> tuple[DataProto, int]:
    """The mm_tool loop's trajectories (verl's AgentLoopWorker, real Chromium) of ``episodes``, each clicking
    ``POINTS[clicks[i]]``, scored by verl's reward worker (``rm_scores``); and the image placeholder's token id."""
    from verl_mm_tools.envs.gui.miniwob_env import ACTIVE_EPISODE
    from verl_mm_tools.runtime.config import CLASSIC_HOOK
    from verl_mm_tools.runtime.rollout import LocalRollout

    # the server sees trajectories in any order: the episode's button box tells which one it serves
    click_of = {episode.box: point for episode, point in zip(episodes, clicks, strict=True)}

    def script(turn: int, prompt_ids: list[int], images: list[Image.Image]) -> str:
        env = ACTIVE_EPISODE.get()
        if env is None:
            raise RuntimeError("a click demonstration outside a miniwob episode")
        return click_call(click_of[button_box(env.observation)], images)

    prompts, columns = rollout_inputs([click_row(episode, "demo", index) for index, episode in enumerate(episodes)])
    with tempfile.TemporaryDirectory() as workdir:
        output, _, worker = LocalRollout(model_dir, tools_yaml, workdir).run(
            script,
            prompts,
            columns=columns,
            max_turns=DEMONSTRATION_TURNS,
            score=True,
            extra=(*CLASSIC_HOOK, *REWARD_OVERRIDES),
        )
    return output, worker.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)


@dataclass(frozen=True)
class ClickColdStart:
    """What the click task's cold start fits: ``demonstrations`` screenshots, each demonstrated
    ``clicks_per_screenshot`` times, ``steps`` of the warm start's fit."""

    # 128 screenshots, batches of 8 and 1,000 steps at lr 3e-3: the tiny Qwen3-VL's fits localized the red button by
    # 750 steps (0.76-0.78 held out, labels' ceiling 0.85; the tiny Qwen2.5-VL needed 3,000-6,000 steps where it did)
    demonstrations: int = 128
    # Each screenshot's demonstrations: ``true_click_share`` of them click its covered point, the rest each point
    # equally often (16 and one on each point: 0.85 hit), and the fit draws among them at every pick, so a mistake
    # is not tied to a screenshot. With one demonstration per screenshot (a fifth of them mistakes) the fit learned
    # which screenshots to miss: it missed them in every sample, and GRPO's groups were unanimous (session 47)
    clicks_per_screenshot: int = 20
    true_click_share: float = 0.8
    # each digit of the call weighs this much in the loss as each of its other tokens: on the whole call alike, the
    # fit learned the call's text but not where to click (0.245 held out); on the digits alone it learned where
    # (0.34) but not the text around them (call_mass 0.0)
    digit_weight: float = 10.0
    steps: int = 1000
    batch_size: int = 8
    lr: float = 3e-3
    seed: int = 0
    share_examples: int = 16  # screenshots the point shares on the demonstrations are measured on
    held_out: int = 32  # episodes of other seeds, rolled out but not fitted: the held-out true-point share

    def clicks_of(self, point: int) -> list[int]:
        """The points one screenshot's demonstrations click when its button covers ``point``."""
        knowing = round(self.true_click_share * self.clicks_per_screenshot)
        guessing = self.clicks_per_screenshot - knowing
        if guessing % len(POINTS):
            raise ValueError(
                f"ClickColdStart: {self.clicks_per_screenshot} clicks per screenshot at true share "
                f"{self.true_click_share} leave {guessing} guesses, not a multiple of the {len(POINTS)} points"
            )
        return [point] * knowing + list(range(len(POINTS))) * (guessing // len(POINTS))


# 5: the red button, mistakes, the held-out check; 6: weighted digits; 7: mistakes per pick; 8: the tiny Qwen3-VL
COLD_START_VERSION = 8
# The held-out true-point share the fit must reach (chance 0.25): below it, RL would start from a model that does
# not see where the button is, as on the plain page
HELD_OUT_SHARE_FLOOR = 0.3
HELD_OUT_SEED_OFFSET = 50_000  # held-out episodes' seeds, after the demonstrations' within the demo seed's range
# Demonstrations rolled out together: one browser each (~160 MiB and 14 processes); 128 at once on this 24 GiB
# machine, beside a demo's trainer, made Ray's memory monitor kill the trainer's agent-loop workers
DEMONSTRATIONS_AT_ONCE = 32
MARKER = "click_cold_start.json"


def click_cold_started_model(base_dir: Path, tools_yaml: Path, seed: int, steps: int) -> Path:
    """The click task's cold-started copy of ``base_dir`` (the demo's ``ColdStart``), built once, then reused."""
    from verl_mm_tools.demo.warm_start import cached_model
    from verl_mm_tools.remote.tool import without_remote

    spec = ClickColdStart(steps=steps, seed=seed)
    tools_text = without_remote(Path(tools_yaml).read_text())
    key = {"version": COLD_START_VERSION, "base": base_dir.name, "tools": tools_text, **asdict(spec), "env": ENV}
    key["points"] = [list(point) for point in POINTS]

    def build(scratch: Path) -> tuple[Path, dict]:
        model, local_tools = scratch / "model", scratch / "tools.yaml"
        shutil.copytree(base_dir, model)
        local_tools.write_text(tools_text)
        return model, cold_start(model, local_tools, spec)

    return cached_model(base_dir, "click", key, MARKER, build)


def cold_start(model_dir: Path, tools_yaml: Path, spec: ClickColdStart) -> dict:
    """Fit the model in ``model_dir``, in place, to click demonstrations with mistakes (``ClickColdStart.clicks_of``);
    returns the fit's figures, the demonstrations' success (0.85), the point shares the fitted model gives on its
    demonstrations, and its true-point share on held-out screenshots (``ColdStartError`` below
    ``HELD_OUT_SHARE_FLOOR``)."""
    from transformers import AutoModelForImageTextToText

    started = time.perf_counter()
    first_seed = DEMO_SEED_START + spec.seed * SEEDS_PER_DEMO_SEED
    episodes = click_episodes(spec.demonstrations, first_seed)
    held = click_episodes(spec.held_out, first_seed + HELD_OUT_SEED_OFFSET, {episode.box for episode in episodes})
    # Each screenshot is rolled out once, clicking its covered point; a demonstration of another click on it is the
    # same prompt with that click's call (with_call): the loop's tokens for the call are the same on every page
    examples, calls = rolled_out_hits(model_dir, tools_yaml, [*episodes, *held])
    digits = digit_ids(model_dir)
    demonstrations = [
        weighted_digits(with_call(example, calls[click]), digits, spec.digit_weight)
        for example, episode in zip(examples, episodes, strict=False)
        for click in spec.clicks_of(episode.point)
    ]
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    with one_thread():
        losses = fit(model, demonstrations, spec)
        shared = slice(spec.share_examples)
        shares = point_shares(model, examples[shared], points_of(episodes)[shared], calls)
        held_shares = point_shares(model, examples[len(episodes) :], points_of(held), calls)
    hits = [click == point for point in range(len(POINTS)) for click in spec.clicks_of(point)]
    report = {
        "seconds": round(time.perf_counter() - started, 2),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "demonstration_success": round(sum(hits) / len(hits), 4),
        **shares,
        "held_out_true_point_share": held_shares["true_point_share"],
        "held_out_true_call_probability": held_shares["true_call_probability"],
    }
    logger.info("click cold start: %s", report)
    if report["held_out_true_point_share"] < HELD_OUT_SHARE_FLOOR:
        raise ColdStartError(
            f"click cold start: its true-point share on {spec.held_out} held-out screenshots is "
            f"{report['held_out_true_point_share']}, under {HELD_OUT_SHARE_FLOOR} (chance 0.25): it does not see "
            f"where the button is, and RL would start at chance. Try another --seed: whether this fit leaves chance "
            f"depends on its seed (docs/experiments/gui_click.md). Its figures: {report}"
        )
    model.save_pretrained(model_dir)
    return report


def rolled_out_hits(
    model_dir: Path, tools_yaml: Path, episodes: Sequence[ClickEpisode]
) -> tuple[list[dict[str, Any]], dict[int, list[int]]]:
    """The fit's examples of ``episodes``, each clicking its covered point through the real loop, and each point's
    call (token ids). ``ColdStartError`` where such a click did not hit: the page or the mapping of the shown
    screenshot to it is not what the task assumes."""
    examples, successes = rolled_out_examples(model_dir, tools_yaml, episodes, points_of(episodes))
    missed = [episode.seed for episode, success in zip(episodes, successes, strict=True) if success != 1.0]
    if missed:
        raise ColdStartError(
            f"click cold start: a click on the covered point did not hit in {len(missed)} of {len(episodes)} "
            f"episodes (seeds {missed[:8]}); check miniwob's click-test page and the screenshot's size"
        )
    calls = {episode.point: example["call"] for example, episode in zip(examples, episodes, strict=True)}
    if sorted(calls) != list(range(len(POINTS))):
        raise ColdStartError(f"click cold start: its episodes cover the points {sorted(calls)}, not all of POINTS")
    return examples, calls


def with_call(example: dict[str, Any], call: Sequence[int]) -> dict[str, Any]:
    """The example's prompt followed by ``call`` (token ids), labelled: the demonstration of that call on the same
    screenshot (what follows a call is not trained and does not change its tokens' loss)."""
    start = example["prompt_length"]
    tokens = torch.tensor(call)
    labels = torch.cat([torch.full((start,), -100), tokens])
    return {
        **example,
        "input_ids": torch.cat([example["input_ids"][:start], tokens]),
        "labels": labels,
        "weights": (labels != -100).float(),
        "mm_token_type_ids": torch.cat([example["mm_token_type_ids"][:start], torch.zeros_like(tokens)]),
        "call": list(call),
    }


def digit_ids(model_dir: Path) -> list[int]:
    """The token ids of the digits 0-9 in the model's tokenizer (Qwen's writes a number digit by digit)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = [tokenizer.convert_tokens_to_ids(digit) for digit in "0123456789"]
    if not all(isinstance(id_, int) and id_ != tokenizer.unk_token_id for id_ in ids):
        raise ValueError(f"the tokenizer of {model_dir} has no token for each digit: {ids}")
    return cast("list[int]", ids)


def weighted_digits(example: dict[str, Any], digits: Sequence[int], weight: float) -> dict[str, Any]:
    """The example with each labelled digit's loss weight ``weight`` (the other labelled tokens keep 1): where to
    click is in a call's two leading digits, a tenth of its tokens."""
    is_digit = torch.isin(example["labels"], torch.tensor(digits))
    return {**example, "weights": torch.where(is_digit, weight * example["weights"], example["weights"])}


def points_of(episodes: Sequence[ClickEpisode]) -> list[int]:
    return [episode.point for episode in episodes]


def rolled_out_examples(
    model_dir: Path, tools_yaml: Path, episodes: Sequence[ClickEpisode], clicks: Sequence[int]
) -> tuple[list[dict[str, Any]], list[float]]:
    """The fit's examples of ``episodes`` clicking ``clicks``, and each one's reward, in rollouts of
    ``DEMONSTRATIONS_AT_ONCE`` (no browser of them left idle)."""
    from verl_mm_tools.envs.gui.miniwob_env import POOL

    examples, successes = [], []
    try:
        for at in range(0, len(episodes), DEMONSTRATIONS_AT_ONCE):
            part = slice(at, at + DEMONSTRATIONS_AT_ONCE)
            output, image_token = demonstration_rollout(model_dir, tools_yaml, episodes[part], clicks[part])
            examples += [click_example(output, index, image_token) for index in range(len(output))]
            successes += output.batch["rm_scores"].sum(-1).tolist()
    finally:
        POOL.close_all()
    return examples, successes


def click_example(output: DataProto, index: int, image_token: int) -> dict[str, Any]:
    """Row ``index`` of the demonstrations' rollout as a training example of the fit (``demo.fit``): its ids, labels
    on the trained response tokens (the call), each labelled token's weight, and its image inputs."""
    from verl_mm_tools.runtime.batch import unpadded_row

    row = unpadded_row(output, index)
    ids = row["prompt_ids"] + row["response_ids"]
    labels = [-100] * len(row["prompt_ids"]) + [
        token if trained else -100 for token, trained in zip(row["response_ids"], row["response_mask"], strict=True)
    ]
    inputs = expanded_inputs(output.non_tensor_batch["multi_modal_inputs"][index])
    return {
        "input_ids": torch.tensor(ids),
        "labels": torch.tensor(labels),
        "weights": torch.tensor([float(label != -100) for label in labels]),
        "mm_token_type_ids": (torch.tensor(ids) == image_token).long(),
        "pixel_values": inputs["pixel_values"],
        "image_grid_thw": inputs["image_grid_thw"],
        "prompt_length": len(row["prompt_ids"]),
        "call": row["response_ids"][: row["response_mask"].index(0)] if 0 in row["response_mask"] else [],
        "calls": True,
        "sight": False,
    }


@torch.no_grad()
def point_shares(
    model: PreTrainedModel, examples: Sequence[dict], points: Sequence[int], calls: dict[int, list[int]]
) -> dict[str, Any]:
    """Each point's share of the model's probability among the four calls (``calls``: point -> token ids), averaged
    over ``examples``: ``point_shares``; the mean share of each example's covered point (``points``;
    ``true_point_share``: 0.25 when where it clicks tells nothing of where the button is); the mean probability of
    writing the covered point's call (``true_call_probability``: the share of sampled calls that hit); and the mean
    probability of writing one of the four calls at all (``call_mass``: the rest is other text, e.g. a point off the
    grid)."""
    if sorted(calls) != list(range(len(POINTS))):
        raise ValueError(f"the calls given are for the points {sorted(calls)}, not for all {len(POINTS)}")
    if len(points) != len(examples):
        raise ValueError(f"point_shares takes one covered point per example: {len(points)} for {len(examples)}")
    pad = model.config.get_text_config().pad_token_id or 0
    scores = []
    for example in examples:
        start = example["prompt_length"]
        each = []
        for point in range(len(POINTS)):
            candidate = with_call(example, calls[point])
            batch = model_inputs(collate([candidate], pad))
            logits = model.lm_head(model.model(**batch).last_hidden_state[0, start - 1 : -1]).float()
            each.append(logits.log_softmax(-1).gather(-1, candidate["input_ids"][start:, None]).sum())
        scores.append(torch.stack(each))  # each call's log-probability
    shares = torch.stack([score.softmax(-1) for score in scores])
    rows = torch.arange(len(scores))
    return {
        "point_shares": [round(float(v), 4) for v in shares.mean(0)],
        "true_point_share": round(float(shares[rows, list(points)].mean()), 4),
        "true_call_probability": round(float(torch.stack(scores).exp()[rows, list(points)].mean()), 4),
        "call_mass": round(float(torch.stack(scores).exp().sum(-1).mean()), 4),
    }
