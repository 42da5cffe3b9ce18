"""``verl-mm-tools eval``: a dataset's rows through verl's AgentLoopWorker and the mm_tool loop, with a chat endpoint
(``EndpointClient``) or a checkpoint (``CheckpointClient``) in the place of the inference server.

Everything else is what training runs: verl's RLHFDataset reads the parquet, the worker runs the loop with the
tool YAML's tools, the image workspace, budget and environments, verl's reward worker scores each trajectory with the
configured reward manager, the step hook publishes trajectory dumps (``verl-mm-tools view OUT/<mode>/trajectories``),
all on verl's validation path (``validate``). Its sampling is verl's ``actor_rollout_ref.rollout.val_kwargs``: greedy,
or ``samples`` answers per row at ``temperature``, the rows repeated as verl's validation repeats them. Rows run in
batches of ``batch_size`` prompts; a trajectory that fails is masked by the loop and stays in the report with its
error. With a judge (``judge``, ``--judge``), ``judge_reward`` scores every row at the judge's endpoint, seeing the
question and the images the loop hands it, and the report adds the judge's counts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.evaluate.judging import DEFAULT_IMAGES, JudgeFlags

if TYPE_CHECKING:
    import numpy as np
    from omegaconf import DictConfig
    from transformers import PreTrainedTokenizerBase
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto

logger = logging.getLogger(__name__)

TOOLS, NO_TOOLS = "tools", "no_tools"
DUMP_FOLDER = "trajectories"
# with several samples and no --temperature: verl's default rollout temperature, the policy's own distribution
SAMPLING_TEMPERATURE = 1.0
VAL_KWARGS = "actor_rollout_ref.rollout.val_kwargs"
SAMPLING_KEYS = ("n", "temperature", "do_sample")  # val_kwargs set by --samples and --temperature only


@dataclass(frozen=True)
class EvalOptions:
    data: Path
    out: Path
    model_path: str  # the model's processor and tokenizer (and, with a checkpoint, its weights)
    tools_yaml: Path | None = None  # verl's tool config (actor_rollout_ref.rollout.multi_turn.tool_config_path)
    loop_config: Path | None = None  # verl's agent-loop YAML of the training run (its mm_tool options)
    modes: tuple[str, ...] = (TOOLS,)  # TOOLS and/or NO_TOOLS
    reward_fn: str | None = None
    batch_size: int = 32
    max_turns: int = 4
    prompt_length: int = 1024
    response_length: int = 1024
    samples: int = 1  # answers per row (verl's val_kwargs.n)
    temperature: float | None = None  # None: greedy for one sample, SAMPLING_TEMPERATURE for several
    overrides: tuple[str, ...] = field(default_factory=tuple)  # hydra overrides of verl's trainer config, last
    # a VLM judge scores every row (``judge_reward``), ``reward_fn`` its rule reward when given
    judge: JudgeFlags | None = None

    def __post_init__(self) -> None:
        if not self.data.is_file():
            raise ConfigError(f"--data {self.data}: no such file (a parquet file verl's RLHFDataset reads)")
        for flag, path in (("--tools", self.tools_yaml), ("--loop-config", self.loop_config)):
            if path is not None and not path.is_file():
                raise ConfigError(f"{flag} {path}: no such file")
        if TOOLS in self.modes and self.tools_yaml is None:
            raise ConfigError("evaluating with tools needs --tools FILE.yaml (verl's tool config); or pass --no-tools")
        if self.batch_size < 1 or self.max_turns < 1:
            raise ConfigError(f"--batch-size and --max-turns must be >= 1, got {self.batch_size}, {self.max_turns}")
        self._check_sampling()
        if self.judge is not None:
            self.judge.check(self.reward_fn)

    @property
    def sampling_temperature(self) -> float:
        if self.temperature is not None:
            return self.temperature
        return 0.0 if self.samples == 1 else SAMPLING_TEMPERATURE

    def _check_sampling(self) -> None:
        if self.samples < 1:
            raise ConfigError(f"--samples must be >= 1, got {self.samples}")
        if not math.isfinite(self.sampling_temperature) or self.sampling_temperature < 0:
            raise ConfigError(f"--temperature must be a number >= 0 (0: greedy), got {self.temperature}")
        if self.samples > 1 and self.sampling_temperature == 0:
            raise ConfigError(
                f"--samples {self.samples} with --temperature 0: greedy decoding gives every sample of a row the same "
                f"answer; pass a temperature above 0 (omitted: {SAMPLING_TEMPERATURE}) or --samples 1"
            )
        for override in self.overrides:
            key = override.split("=", 1)[0].lstrip("+~")
            if key == VAL_KWARGS or key in {f"{VAL_KWARGS}.{name}" for name in SAMPLING_KEYS}:
                raise ConfigError(
                    f"the override {override!r} sets what --samples and --temperature set; pass those instead "
                    f"(val_kwargs.top_p and top_k overrides apply)"
                )


def trainer_overrides(options: EvalOptions, mode: str) -> list[str]:
    """verl's trainer config for one mode: the classic step hook (it publishes the dumps), the reward manager, the
    loop (``loop_entries``), no rollout log-probs (an endpoint has none to give); the user's overrides last."""
    from verl_mm_tools.runtime.config import CLASSIC_HOOK, V1_SAMPLES

    loops_yaml = options.out / mode / "agent_loops.yaml"
    loops_yaml.parent.mkdir(parents=True, exist_ok=True)
    entries = loop_entries(options, mode)
    loops_yaml.write_text(json.dumps(entries))
    overrides = [
        "actor_rollout_ref.rollout.name=vllm",  # any name: the worker talks to the client it is handed
        "actor_rollout_ref.rollout.calculate_log_probs=false",
        f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={options.max_turns}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops_yaml}",
        # the rollout's lengths follow these, as in training
        f"data.max_prompt_length={options.prompt_length}",
        f"data.max_response_length={options.response_length}",
        "data.return_raw_chat=true",
        "reward.reward_manager.name=mm_turn_discount",
        *(V1_SAMPLES if several_samples(entries) else CLASSIC_HOOK),
        *sampling_overrides(options),
    ]
    if options.judge is not None:  # judge_reward, with reward_fn as its rule reward
        overrides += options.judge.overrides(options.reward_fn)
    elif options.reward_fn:
        overrides.append(f"+reward.reward_kwargs.reward_fn={options.reward_fn}")
    if mode == TOOLS:
        overrides.append(f"actor_rollout_ref.rollout.multi_turn.tool_config_path={options.tools_yaml}")
    return [*overrides, *options.overrides]


def several_samples(entries: list[dict]) -> bool:
    """Whether the mm_tool entry makes several training samples per trajectory (``export`` per_turn or auto, or
    ``keep_last_images``, which chooses auto)."""
    from verl_mm_tools.plugin import LOOP_NAME

    ours = next(entry for entry in entries if entry.get("name") == LOOP_NAME)  # loop_entries adds one
    return ours.get("keep_last_images") is not None or ours.get("export", "per_trajectory") != "per_trajectory"


def sampling_overrides(options: EvalOptions) -> list[str]:
    """verl's validation sampling: its agent-loop worker hands the server client val_kwargs' temperature (top_p,
    top_k) on ``validate``; its trainer repeats each row val_kwargs.n times and passes do_sample along."""
    temperature = options.sampling_temperature
    return [
        f"{VAL_KWARGS}.n={options.samples}",
        f"{VAL_KWARGS}.temperature={temperature}",
        f"{VAL_KWARGS}.do_sample={str(temperature > 0).lower()}",
    ]


def loop_entries(options: EvalOptions, mode: str) -> list[dict]:
    """The training run's agent-loop entries (``loop_config``), the mm_tool one dumping every row under OUT/<mode>
    and reporting masked rows rather than stopping on them; with a judge, handing it the trajectory's question and
    images (``judge_images``: ``--judge-images``, else the loop config's, else all)."""
    import yaml

    from verl_mm_tools.plugin import LOOP_NAME, LOOP_TARGET

    entries = yaml.safe_load(options.loop_config.read_text()) if options.loop_config else []
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise ConfigError(
            f"--loop-config {options.loop_config}: expected verl's agent-loop YAML, a list of entries "
            f"with name and _target_; got {type(entries).__name__}"
        )
    ours = [entry for entry in entries if entry.get("name") == LOOP_NAME]
    if not ours:
        ours = [{"name": LOOP_NAME, "_target_": LOOP_TARGET}]
        entries.append(ours[0])
    ours[0].update(
        dump_dir=str(options.out / mode / DUMP_FOLDER),
        dump_max_per_step=options.batch_size * options.samples,  # a batch: its prompts' samples, every one dumped
        max_masked_fraction=1.0,
    )
    if options.judge is not None:
        ours[0]["judge_images"] = options.judge.images or ours[0].get("judge_images") or DEFAULT_IMAGES
    return entries


def evaluate(
    options: EvalOptions,
    make_client: Callable[[PreTrainedTokenizerBase], object],
    progress: Callable[[int], None] = lambda rows: None,
) -> dict:
    """Run every mode; write OUT/report.json, OUT/report.txt and OUT/<mode>/rows.jsonl; return the report
    ``{"modes": {mode: {data_source: figures}}, "table": text}``. ``make_client(tokenizer)`` gives the object that
    answers the worker's generate calls (its ``faults``, when it has them, are counted per row)."""
    from verl_mm_tools.evaluate.report import build_report, table

    options.out.mkdir(parents=True, exist_ok=True)
    reports = {}
    for mode in options.modes:
        with contextlib.redirect_stdout(sys.stderr):  # verl prints ("Using dataset class"); stdout is the report's
            output, client = _run_mode(options, mode, make_client, progress)
        reports[mode], records = build_report(output, getattr(client, "faults", {}), options.samples)
        _write_lines(options.out / mode / "rows.jsonl", records)
    report: dict[str, Any] = {"data": str(options.data), "modes": reports, "table": table(reports)}
    (options.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (options.out / "report.txt").write_text(report["table"] + "\n")
    return report


def _run_mode(
    options: EvalOptions,
    mode: str,
    make_client: Callable[[PreTrainedTokenizerBase], object],
    progress: Callable[[int], None],
) -> tuple[DataProto, object]:
    from verl.protocol import DataProto
    from verl.utils.ray_utils import get_event_loop

    from verl_mm_tools.runtime.config import compose_trainer_config
    from verl_mm_tools.runtime.workers import generate, in_process_manager, restored_loop_registry

    config = compose_trainer_config(options.model_path, trainer_overrides(options, mode))
    with restored_loop_registry():
        # several samples per trajectory: the worker makes a row of each, as verl's v1 worker does, and the report
        # reads each trajectory's final one (``_final_samples``), the one training scores
        per_sample = bool(config.trainer.use_v1)
        manager, worker = in_process_manager(config, per_sample=per_sample)
        client = make_client(worker.tokenizer)
        worker.llm_client = client
        bind_worker = getattr(client, "bind_worker", None)
        if bind_worker is not None:  # the clients read a video prompt through this worker's trainer-side code
            bind_worker(worker)
        outputs = []
        for batch, samples in _batches(options, config, worker):
            outputs.append(_with_row_columns(generate(manager, batch), batch, samples))
            progress(len(batch))
        if hasattr(client, "aclose"):
            get_event_loop().run_until_complete(client.aclose())
    return DataProto.concat(outputs), client


ROW_COLUMNS = ("data_source", "extra_info", "index", "uid")  # what the report groups and names rows by


def _with_row_columns(output: DataProto, batch: DataProto, samples: np.ndarray) -> DataProto:
    """The generated rows with their dataset columns (the trainer unions them the same way) and their sample numbers,
    without the batch's timings and step metrics (the report reads the rows)."""
    from verl_mm_tools.evaluate.report import SAMPLE_KEY

    output = _final_samples(output)
    if len(output) != len(batch):
        raise ConfigError(f"{len(batch)} rows gave {len(output)} trajectories: eval scores one per row")
    for key in ROW_COLUMNS:
        if key in batch.non_tensor_batch:
            output.non_tensor_batch[key] = batch.non_tensor_batch[key]
    output.non_tensor_batch[SAMPLE_KEY] = samples
    output.meta_info.clear()
    return output


def _final_samples(output: DataProto) -> DataProto:
    """Each trajectory's final training sample: the one holding its whole statistics and scored, as verl's v1 trainer
    scores it (a trajectory of several samples: ``export`` per_turn or auto, ``keep_last_images``)."""
    from verl_mm_tools.handoff import SampleFields

    rows = SampleFields.rows(output.non_tensor_batch, len(output))
    final = [row for row, fields in enumerate(rows) if fields is None or fields.sample[0] == fields.sample[1] - 1]
    return output if len(final) == len(output) else output.select_idxs(final)


def _batches(
    options: EvalOptions, config: DictConfig, worker: AgentLoopWorker
) -> Iterator[tuple[DataProto, np.ndarray]]:
    """The parquet's rows as verl's trainer batches them for validation (RLHFDataset, its collate_fn, each row
    repeated val_kwargs.n times, its samples next to each other), with each row's sample numbers."""
    import numpy as np
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    dataset = RLHFDataset(str(options.data), worker.tokenizer, config.data, worker.processor)
    if len(dataset) == 0:
        raise ConfigError(f"--data {options.data} holds no rows")
    val_kwargs = config.actor_rollout_ref.rollout.val_kwargs
    for start in range(0, len(dataset), options.batch_size):
        positions = range(start, min(start + options.batch_size, len(dataset)))
        batch = DataProto.from_single_dict(
            collate_fn([_row(dataset[position], position, options.judge is not None) for position in positions])
        )
        batch = batch.repeat(repeat_times=val_kwargs.n, interleave=True)
        batch.meta_info.update(
            global_steps=start // options.batch_size, validate=True, do_sample=bool(val_kwargs.do_sample)
        )
        yield batch, np.tile(np.arange(val_kwargs.n), len(positions))


def _row(item: dict, position: int, judged: bool) -> dict:
    """A dataset row with the ids its samples share: ``uid`` (the dataset's, else one per row, as verl's validation
    gives; the trainer side numbers each uid's rollouts), ``index`` the row's position when extra_info has none
    (RLHFDataset gives every such row 0, which would make all prompts one). ``judged``: the judge scores every row,
    so a row's own ``extra_info.reward_fn`` (which the reward manager would choose first) is set aside."""
    from verl_mm_tools.rewards.common import REWARD_FN_KEY

    item.setdefault("uid", f"row-{position}")
    extra_info = item.get("extra_info")
    if not isinstance(extra_info, dict) or "index" not in extra_info:
        item["index"] = position
    if judged and isinstance(extra_info, dict) and REWARD_FN_KEY in extra_info:
        item["extra_info"] = {key: value for key, value in extra_info.items() if key != REWARD_FN_KEY}
    return item


def _write_lines(path: Path, records: Sequence[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
