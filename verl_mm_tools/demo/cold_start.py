"""The demo's cold start through verl's own SFT trainer: demonstrations recorded by the real mm_tool loop (a
scripted server writes their turns, ``demonstrations.demonstration_script``), exported with ``export-sft`` and fitted by
``python -m verl.trainer.sft_trainer`` on CPU (``cpu.sft``): the path a user takes from recorded trajectories to a
cold start, run on the demo's tasks.

Used where verl's loss expresses the task's fit: every labelled token weighs the same (verl's token-mean over the
batch) and the labels are the demonstrations' own tokens. ``learn`` and ``learn_tool`` fit that way. The zoom tasks
keep the custom warm start (``warm_start``): ``learn_zoom`` fits "either answer" after a call (the log of the sum of
the answers' probabilities, balanced over the batch) and the main job weighs the answer after a zoom 30 times, and
both fit the answers after a call alone first; verl's SFT loss has neither.

The result is cached next to the base model, keyed by everything that determines it.
"""

from __future__ import annotations

import logging
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from verl_mm_tools.demo.demonstrations import DEMO_SEED_OFFSET, demonstration_script
from verl_mm_tools.demo.format_tasks import TASKS
from verl_mm_tools.demo.warm_start import cached_model
from verl_mm_tools.errors import ConfigError

logger = logging.getLogger(__name__)

COLD_START_VERSION = 1
MARKER = "cold_start.json"
SFT_TASKS = ("color", "color_tool")  # the warm-start tasks verl's SFT loss can fit


@dataclass(frozen=True)
class ColdStartSpec:
    task: str = "color"
    demonstrations: int = 64
    steps: int = 300
    batch_size: int = 4
    lr: float = 1e-2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.task not in SFT_TASKS:
            raise ConfigError(
                f"the SFT cold start fits {list(SFT_TASKS)}; {self.task!r} needs a loss verl's SFT trainer does not "
                "have: use the custom warm start (demo.warm_start)"
            )


def sft_cold_started_model(
    base_dir: str | Path, tools_yaml: str | Path, spec: ColdStartSpec, cache_root: str | Path | None = None
) -> Path:
    """The copy of ``base_dir`` fitted by verl's SFT trainer to recorded demonstrations (built once, then reused)."""
    from verl_mm_tools.remote.tool import without_remote

    base_dir = Path(base_dir)
    tools_text = without_remote(Path(tools_yaml).read_text())
    key = {"version": COLD_START_VERSION, "base": base_dir.name, "tools": tools_text, **asdict(spec)}

    def build(scratch: Path) -> tuple[Path, dict]:
        (scratch / "tools.yaml").write_text(tools_text)
        summary = record_and_export(base_dir, scratch / "tools.yaml", spec, scratch)
        return fit_with_verl(base_dir, scratch / "sft" / "train.parquet", spec, scratch / "trainer"), {
            "export": summary
        }

    return cached_model(base_dir, "sft", key, MARKER, build, cache_root)


def record_and_export(base_dir: Path, tools_yaml: Path, spec: ColdStartSpec, work: Path) -> dict:
    """Run the demonstrations through the mm_tool loop with dumps on, then export them (``work/sft``)."""
    from verl_mm_tools.runtime.batch import image_prompt
    from verl_mm_tools.runtime.rollout import LocalRollout, run_steps
    from verl_mm_tools.trajectories.sft import export_sft

    task = TASKS[spec.task]
    pictures = task.pictures(spec.demonstrations, spec.seed + DEMO_SEED_OFFSET)
    script, _ = demonstration_script(task, pictures, random.Random(spec.seed))
    prompts = [image_prompt(task.question, [picture]) for picture, _ in pictures]
    columns = {
        "data_source": [f"verl_mm_tools/{spec.task}_demonstrations"] * len(prompts),
        "reward_model": [{"style": "rule", "ground_truth": truth} for _, truth in pictures],
        "extra_info": [{"index": index} for index in range(len(prompts))],
        "index": list(range(len(prompts))),
    }
    dump = work / "demonstrations"
    options = {"dump_dir": str(dump), "dump_max_per_step": len(prompts)}
    rollout = LocalRollout(base_dir, tools_yaml, work)
    # scored as the demo's color tasks score (run_steps sets the rotation reward first)
    reward = ["reward.reward_kwargs.reward_fn=exact_answer_reward"]
    run_steps(rollout, lambda tokenizer: script, prompts, columns, steps=(1,), loop_options=options, extra=reward)
    summary = export_sft([dump], work / "sft")
    if summary["records"] != len(prompts):
        raise ConfigError(f"the cold start recorded {len(prompts)} demonstrations but exported {summary}")
    return summary


def fit_with_verl(base_dir: Path, train_file: Path, spec: ColdStartSpec, out: Path) -> Path:
    from verl_mm_tools.cpu.sft import run_verl_sft

    # cosine to 0, as the custom warm start: at a constant rate the last batches' random labels set the answer's
    # prior (demo.fit.fit)
    return run_verl_sft(
        base_dir,
        train_file,
        out,
        steps=spec.steps,
        lr=spec.lr,
        batch_size=spec.batch_size,
        seed=spec.seed,
        overrides=["optim.lr_scheduler_type=cosine"],
    )
