"""The demo's task catalogue: what each ``verl-mm-tools demo --task`` trains and when it has learned. How a run is
launched and watched: ``run``.

Tasks: ``zoom`` (the main job: the answer is hidden at the picture's prompt resolution and ``zoom_in`` reveals it; a
cold start that reads the zoomed box calls it in half its turns, and RL learns to call it: learned once reward and
tool-call rate reach 0.9), ``learn_zoom`` (the same, from a warm start that has not learned to read the zoomed box:
RL learns to read it and to call), ``learn`` (red or blue pictures, reward from chance 0.5 to >= 0.9; the run stops
once the model has learned), ``learn_tool`` (the same with a rotate call before each answer), ``rotation`` (the
arrow pictures, a showcase of the loop; the tiny model cannot see arrows well, so its reward stays near chance) and
``click`` (MiniWoB++'s click-test in headless Chromium with the button painted red, one click on one of four points,
from a cold start of demonstrations with mistakes that must localize the button on held-out screenshots before RL:
``click_task``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from verl_mm_tools.errors import ConfigError, did_you_mean
from verl_mm_tools.step_metrics import CALL_RATE, REWARD_MEAN
from verl_mm_tools.tiny import DEFAULT_FAMILY
from verl_mm_tools.tools.tool_yaml import (
    CLICK_TOOLS_YAML,
    GET_FRAMES_TOOLS_YAML,
    ROTATE_TOOLS_YAML,
    ZOOM_TOOLS_YAML,
)

# Sequences per forward/backward in the trainer: 8 made old_log_prob + update_actor ~1.8x faster than 32 (measured,
# 32 trajectories of ~600 tokens per step, one thread).
MICRO_BATCH = 8
# The mean training reward of a step, per trajectory (the step hook's; verl's critic/score/mean counts a trajectory
# exported as several samples once per sample)
TRAINING_REWARD = REWARD_MEAN
LEARNED_WINDOW = 5


class ColdStart(Protocol):
    """A task's own cold start (in place of the warm start's format tasks): the cold-started copy of ``model`` for
    the tools in ``tools_yaml``, fitted for ``steps`` with ``seed``."""

    def __call__(self, model: Path, tools_yaml: Path, seed: int, steps: int) -> Path: ...


class DatasetWriter(Protocol):
    """Writes a task's ``train.parquet`` and ``val.parquet`` under ``out_dir``; returns their paths."""

    def __call__(self, out_dir: Path, *, train_size: int, val_size: int, seed: int) -> tuple[Path, Path]: ...


@dataclass(frozen=True)
class DemoTask:
    """What differs between the demo's tasks."""

    name: str
    warm_start_task: str  # a key of warm_start.TASKS
    warm_start_steps: int
    write_dataset: DatasetWriter  # (out_dir, train_size=, val_size=, seed=) -> train, val
    validation_metric: str  # verl's name of the greedy validation reward
    reward: tuple[str, ...]  # reward overrides
    lr: float
    steps: int
    prompts_per_step: int = 8
    rollouts_per_prompt: int = 4
    overrides: tuple[str, ...] = ()
    # Stop once ``learned``: the mean training reward of the last LEARNED_WINDOW steps and the latest validation
    # reward both reach this (the validation ``stop_at_validation`` instead, where set)
    stop_at_reward: float | None = None
    stop_at_validation: float | None = None
    tools_yaml: str = ROTATE_TOOLS_YAML
    chance_reward: float = 0.5  # the mean reward of answers that ignore the picture
    # Also needed to have learned: the mean tool-call rate of the last LEARNED_WINDOW steps reaches this
    stop_at_call_rate: float | None = None
    # What the warm start teaches, in the demo's progress line
    warm_start_says: str = "the output format, with labels that tell nothing"
    # Its warm start can be fitted by verl's own SFT trainer on demonstrations the loop recorded and export-sft wrote
    # (``demo --sft-warm-start``, demo.cold_start): verl's token loss is the custom fit's (demo.warm_start)
    sft_cold_start: bool = False
    # A cold start of the task's own (the GUI task's: demonstrations on a browser), replacing warm_start_task's
    cold_start: ColdStart | None = None
    # The rows name files relative to the data folder (the video task's clips): the loop's file_roots is that folder
    reads_data_files: bool = False
    warm_start_lr: float | None = None  # None: WarmStartSpec's
    family: str = DEFAULT_FAMILY  # the tiny model's VLM family where the run names none (--family)

    def learned(self, steps: list[dict]) -> bool:
        """The mean training reward of the last LEARNED_WINDOW steps reaches ``stop_at_reward``, the latest
        validation reward (greedy, on pictures the training split does not hold) ``validation_target``, and the mean
        tool-call rate of those steps ``stop_at_call_rate`` where set; verl's metrics, one dict per step. A
        validation before the first training step (``val_before_train``) judges the cold start, not what was
        learned: it never counts."""
        target = self.validation_target
        if self.stop_at_reward is None or target is None:
            return False
        rewards = [step[TRAINING_REWARD] for step in steps if TRAINING_REWARD in step]
        rates = [step.get(CALL_RATE, 0.0) for step in steps if TRAINING_REWARD in step]
        validations = self.validations_after_training_began(steps)
        calls_enough = self.stop_at_call_rate is None or (
            sum(rates[-LEARNED_WINDOW:]) / LEARNED_WINDOW >= self.stop_at_call_rate
        )
        return (
            len(rewards) >= LEARNED_WINDOW
            and bool(validations)
            and calls_enough
            and sum(rewards[-LEARNED_WINDOW:]) / LEARNED_WINDOW >= self.stop_at_reward
            and validations[-1] >= target
        )

    @property
    def validation_target(self) -> float | None:
        return self.stop_at_reward if self.stop_at_validation is None else self.stop_at_validation

    def validations_after_training_began(self, steps: list[dict]) -> list[float]:
        """The validation rewards logged with or after the first training step's metrics, in order."""
        found: list[float] = []
        trained = False
        for step in steps:
            trained = trained or TRAINING_REWARD in step
            if trained and self.validation_metric in step:
                found.append(step[self.validation_metric])
        return found


def _write_rotation(out_dir: Path, *, train_size: int, val_size: int, seed: int) -> tuple[Path, Path]:
    from verl_mm_tools.data.rotation import write_rotation_dataset

    return write_rotation_dataset(out_dir, train_size=train_size, val_size=val_size, seed=seed)


def _write_color(out_dir: Path, *, train_size: int, val_size: int, seed: int) -> tuple[Path, Path]:
    from verl_mm_tools.data.color import write_color_dataset

    return write_color_dataset(out_dir, train_size=train_size, val_size=val_size, seed=seed)


def _write_zoom_color(out_dir: Path, *, train_size: int, val_size: int, seed: int) -> tuple[Path, Path]:
    from verl_mm_tools.data.zoom_color import write_zoom_color_dataset

    return write_zoom_color_dataset(out_dir, train_size=train_size, val_size=val_size, seed=seed)


TASKS = {
    "rotation": DemoTask(
        name="rotation",
        warm_start_task="rotation",
        warm_start_steps=200,
        write_dataset=_write_rotation,
        validation_metric="val-core/verl_mm_tools/rotation/reward/mean@1",
        reward=(
            "+reward.reward_kwargs.reward_fn=rotation_reward_180",
            "+reward.reward_kwargs.reward_fn_kwargs.require_tag=true",
        ),
        lr=1e-4,
        steps=30,
        overrides=("data.max_prompt_length=512",),
    ),
    # Why each setting: README_VLMRL.md, "The learning proof" (measured with verl's trainer and an in-process
    # stand-in of its GRPO update).
    "learn": DemoTask(
        name="learn",
        warm_start_task="color",
        warm_start_steps=300,
        write_dataset=_write_color,
        # verl names the core validation metric "acc" when the reward function returns one (exact_answer_reward does)
        validation_metric="val-core/verl_mm_tools/color/acc/mean@1",
        reward=("+reward.reward_kwargs.reward_fn=exact_answer_reward",),
        # 8 rollouts per prompt: a GRPO group whose rollouts all give the same answer has no advantage, and with 4
        # the policy drifted into "always red" before it learned to look
        lr=3e-3,
        steps=80,
        prompts_per_step=4,
        rollouts_per_prompt=8,
        overrides=(
            "data.max_prompt_length=768",
            "actor_rollout_ref.actor.optim.lr_warmup_steps=10",  # Adam's first full-size steps collapse it
            # a KL loss to the warm-started model pulls the answer format back when an update dents it.
            # k3+: verl logs k3 but follows k2's gradient, which grows with the log-ratio; k3's is at most 1
            # for a token the policy now samples far more often than the reference (a dented format)
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.kl_loss_coef=0.1",
            "actor_rollout_ref.actor.kl_loss_type=k3+",
            f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO_BATCH}",
            "data.shuffle=false",  # the rows alternate colors: every batch holds both equally
            "trainer.val_before_train=true",
            "trainer.test_freq=5",
            "trainer.save_freq=5",
        ),
        stop_at_reward=0.9,
        sft_cold_start=True,
    ),
}
# Learning when a tool pays: the centre's checkerboard is invisible at prompt resolution (demo.premise checks it);
# the warm start answers at once or zooms in first, half and half, with labels that tell nothing.
# lr 1e-3: at 2e-3 an update now and then garbled the ~50-token call (7-13 % of trajectories malformed per 10 steps,
# which capped the reward); at 1e-3 that happened about half as often and the 14x box was read as fast.
# KL 0.35: the KL coefficient sets the call rate's ceiling (at 1.0 it settled near 0.6); at 0.25 the call format of
# one seed broke before reading the zoomed box paid off, and calling stopped (docs/experiments/learn_zoom.md, "Why KL
# 1.0 held calling near 0.6"). top_p 0.98: at temperature 1 each of the call's ~50 tokens keeps a small chance of a
# slip, and one slip breaks the call; nucleus sampling never samples those tokens (malformed trajectories fell from
# 2-5 % to 0 over the first 10 steps), while a token the updates push past the 2 % line is still sampled and so still
# penalised.
CALL_FORMAT_LR = 1e-3
CALL_FORMAT_OVERRIDES = (
    *TASKS["learn"].overrides,
    "actor_rollout_ref.actor.kl_loss_coef=0.35",
    "actor_rollout_ref.rollout.top_p=0.98",
)
TASKS["learn_zoom"] = replace(
    TASKS["learn"],
    name="learn_zoom",
    warm_start_task="zoom_color",
    sft_cold_start=False,  # its "either answer" fit is not a loss verl's SFT trainer has (demo.cold_start)
    warm_start_steps=600,
    write_dataset=_write_zoom_color,
    validation_metric="val-core/verl_mm_tools/zoom_color/acc/mean@1",
    tools_yaml=ZOOM_TOOLS_YAML,
    lr=CALL_FORMAT_LR,
    steps=120,
    overrides=CALL_FORMAT_OVERRIDES,
    stop_at_call_rate=0.9,
)
# The learning proof with a rotate call before every answer: the answer follows the tool's image. learn_zoom's
# guards of the call's format: at learn's lr 3e-3 and KL 0.1 the answers after the tool's image never began to
# follow it in 45 steps and up to 25 of 32 broke their format (docs/experiments/sft_warm_start.md).
TASKS["learn_tool"] = replace(
    TASKS["learn"],
    name="learn_tool",
    warm_start_task="color_tool",
    lr=CALL_FORMAT_LR,
    steps=120,
    overrides=CALL_FORMAT_OVERRIDES,
)

# The main job: learning when a tool pays, from a cold start that reads the zoomed box (its answers after a zoom are
# the true ones) but zooms in only half its first turns, at random. Answering at once scores 0.5; RL raises the
# tool-call rate and the reward with it. learn_zoom's RL settings; 600 format steps: at 450 the call's digits stayed
# below p 0.9 on some seeds (docs/experiments/main_job.md); 40 steps: the slowest of 10 runs learned in 28.
TASKS["zoom"] = replace(
    TASKS["learn_zoom"],
    name="zoom",
    warm_start_task="zoom_read",
    warm_start_steps=600,
    steps=40,
    warm_start_says="zoom_in calls and true answers after them, answers at once at chance; calls in half its turns",
)


def _write_click(out_dir: Path, *, train_size: int, val_size: int, seed: int) -> tuple[Path, Path]:
    from verl_mm_tools.demo.click_task import write_click_dataset

    return write_click_dataset(out_dir, train_size=train_size, val_size=val_size, seed=seed)


def _click_cold_start(model: Path, tools_yaml: Path, seed: int, steps: int) -> Path:
    from verl_mm_tools.demo.click_task import click_cold_started_model

    return click_cold_started_model(model, tools_yaml, seed, steps)


# The GUI task: MiniWoB++'s click-test in headless Chromium with its button painted red (high_contrast), one click per
# episode on one of four points, from a cold start of demonstrations with mistakes (each screenshot's clicks hit in
# 0.85 of them, a miss on every other point alike: demo.click_task), with learn_tool's RL settings (every answer is a
# ~30-token call). On the plain grey-on-white page the tiny model did not see the button and stayed at chance; the red
# one it localizes in a supervised fit (docs/experiments/gui_click.md, session 44). Its tiny model is a Qwen3-VL, whose
# vision tower adds a position embedding to each patch and whose M-RoPE interleaves time, height and width: its fits
# localized both axes on every seed tried within 1,000 steps, where a tiny Qwen2.5-VL (no absolute position in its
# tower, the image's width on M-RoPE's lowest frequencies) found one axis or none on half of them (session 48). With a
# fifth of the screenshots demonstrated wrongly, the fit missed those in every sample and GRPO's groups were
# unanimous; with the mistakes spread over each screenshot's demonstrations, its groups hit and miss (session 47).
# RL's part: the sampled policy's success, ~0.8 after the cold start, past the demonstrations' 0.85 to 0.95 over 5
# steps (160 trajectories, 20 screenshots); the greedy policy already clicks most held-out buttons, so its validation
# must only stay at 15 of 16.
TASKS["click"] = replace(
    TASKS["learn_tool"],
    name="click",
    family="qwen3_vl",
    warm_start_task="click",
    sft_cold_start=False,
    cold_start=_click_cold_start,
    warm_start_steps=1000,  # demo.click_task.ClickColdStart: why
    write_dataset=_write_click,
    validation_metric="val-core/miniwob/click-test/acc/mean@1",
    reward=(),  # the rows' own: environment_reward, MiniWoB's success
    tools_yaml=CLICK_TOOLS_YAML,
    chance_reward=0.25,
    stop_at_reward=0.95,
    stop_at_validation=0.9,
    steps=50,
    warm_start_says="each screenshot's demonstrations click the covered point in 85 %, every other point in 5 %",
)


def _write_video(out_dir: Path, *, train_size: int, val_size: int, seed: int) -> tuple[Path, Path]:
    from verl_mm_tools.data.video import DEMO_FLASH_FRAME, write_video_dataset

    return write_video_dataset(
        out_dir, train_size=train_size, val_size=val_size, seed=seed, first_flash_frame=DEMO_FLASH_FRAME
    )


# The video task: a 4 s clip whose colour flash falls between the frames the prompt samples; get_frames over the
# moment the prompt names shows it (data.video). learn's answer format and learn_tool's RL settings for the call.
# Its cold start at lr 3e-3 for 900 steps: at 1e-2 seed 2's fit did not learn its call (p(call) 0.00 after 600 steps,
# 0.24 after 1,000; seed 1's: 0.45 and 0.47); at 3e-3 seeds 0-3 all did, p 0.40-0.41 after 600 steps and 0.45-0.48
# after 900 (the checked part of 0.5; docs/experiments/video_task.md).
TASKS["video"] = replace(
    TASKS["zoom"],
    name="video",
    warm_start_task="video_read",
    warm_start_steps=900,
    warm_start_lr=3e-3,
    write_dataset=_write_video,
    validation_metric="val-core/verl_mm_tools/video_flash/acc/mean@1",
    tools_yaml=GET_FRAMES_TOOLS_YAML,
    reads_data_files=True,
    steps=40,
    warm_start_says="get_frames calls and true answers after them, answers at once at chance; calls in half its turns",
)


def get_task(name: str) -> DemoTask:
    if name not in TASKS:
        raise ConfigError(f"unknown demo task {name!r}; choose one of {sorted(TASKS)}." + did_you_mean(name, TASKS))
    return TASKS[name]
