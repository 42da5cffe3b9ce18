"""A demo run's inputs, made before the trainer starts: the tiny model (warm-started, cached across runs), the task's
data, and the config files under ``--out`` (``DemoPaths``: where everything of a run is)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from verl_mm_tools.demo.judge import JUDGE_IMAGES
from verl_mm_tools.demo.options import DemoOptions
from verl_mm_tools.demo.tasks import DemoTask
from verl_mm_tools.plugin import LOOP_NAME, LOOP_TARGET
from verl_mm_tools.tiny import DEFAULT_FAMILY


@dataclass(frozen=True)
class DemoPaths:
    """Where a run's inputs are (the model is in the user cache) and where it writes (under ``out``)."""

    out: Path
    model: Path
    train: Path
    val: Path

    @property
    def config(self) -> Path:
        return self.out / "config"

    @property
    def logs(self) -> Path:
        return self.out / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.out / "checkpoints"

    @property
    def rollouts(self) -> Path:
        return self.out / "rollouts"

    @property
    def trajectories(self) -> Path:
        return self.out / "trajectories"

    @property
    def metrics(self) -> Path:
        return self.logs / "metrics.jsonl"

    @property
    def trainer_log(self) -> Path:
        return self.logs / "trainer.log"


def prepare(options: DemoOptions, say: Callable[[str], None]) -> DemoPaths:
    """The model, data and config files of a run (the model and warm start are cached across runs)."""
    from verl_mm_tools.tiny import tiny_model_path

    out = options.out.resolve()
    (out / "config").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    tools = out / "config" / "tools.yaml"
    tools.write_text(Path(options.tools).read_text() if options.tools else options.spec.tools_yaml)
    say("tiny model" if options.tiny_family == DEFAULT_FAMILY else f"tiny {options.tiny_family} model")
    task = options.spec
    model = tiny_model_path(family=options.tiny_family)
    if options.warm_start:
        say(f"warm start: {task.warm_start_says} (cached after the first run; log {out / 'logs'})")
        with quiet(out / "logs" / "warm_start.log"):
            model = warm_started(task, model, tools, options.seed, sft=options.sft_warm_start)
    say(f"{task.name} task")
    train, val = task.write_dataset(
        out / "data", train_size=options.train_size, val_size=options.val_size, seed=options.seed
    )
    paths = DemoPaths(out=out, model=model, train=train, val=val)
    loop: dict[str, object] = {"name": LOOP_NAME, "_target_": LOOP_TARGET}
    if options.env:
        loop["env"] = options.env
    if task.reads_data_files:
        loop["file_roots"] = [str(out / "data")]
    if options.export != "per_trajectory":
        loop["export"] = options.export
    if options.dumps:
        loop.update(dump_dir=str(paths.trajectories), dump_max_per_step=8)
    if options.judge:
        loop["judge_images"] = JUDGE_IMAGES
    (paths.config / "agent_loops.yaml").write_text(json.dumps([loop]))
    return paths


def warm_started(task: DemoTask, model: Path, tools: Path, seed: int, sft: bool = False) -> Path:
    """The task's warm-started copy of ``model``: the custom fit, or (``sft``) verl's SFT trainer on recorded
    demonstrations; or the task's own cold start."""
    if task.cold_start is not None:
        return task.cold_start(model, tools, seed, task.warm_start_steps)
    if sft:
        from verl_mm_tools.demo.cold_start import ColdStartSpec, sft_cold_started_model

        spec = ColdStartSpec(task=task.warm_start_task, steps=task.warm_start_steps, seed=seed)
        return sft_cold_started_model(model, tools, spec)
    from verl_mm_tools.demo.format_tasks import WarmStartSpec
    from verl_mm_tools.demo.warm_start import warm_started_model

    warm_spec = WarmStartSpec(task=task.warm_start_task, steps=task.warm_start_steps, seed=seed)
    if task.warm_start_lr is not None:
        warm_spec = replace(warm_spec, lr=task.warm_start_lr)
    return warm_started_model(model, tools, warm_spec)


@contextlib.contextmanager
def quiet(log_path: Path) -> Iterator[None]:
    """Send what verl and transformers print (progress bars, dataset notices) to a log file instead of the screen."""
    with log_path.open("a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        yield
