"""verl's own multi-turn SFT trainer (``verl.trainer.sft_trainer``) on CPU.

verl documents the trainer under torchrun (``torchrun --standalone --nnodes=1 --nproc_per_node=N -m
verl.trainer.sft_trainer``): it reads its rank from torchrun's environment, with no Ray. On CPU it needs the CPU
platform (``cpu_environment()``: ``VERL_PLATFORM=cpu``, which also applies ``adaptations.cpu``, among them
the gloo backend string of ``initialize_global_process_group``), verl's FSDP engine (registered for ``cuda``:
``VERL_ENGINE_DEVICE=cuda``) and the overrides of ``CPU_SFT_OVERRIDES``, each with its reason. Data: a parquet in
``MultiTurnSFTDataset``'s layout (``messages``, ``images``, optionally ``tools``), as ``export-sft`` writes it.

``run_verl_sft`` launches it in a subprocess and returns the Hugging Face model it saved at the end.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_mm_tools.adaptations.record import Adaptation, Section
from verl_mm_tools.cpu.overrides import THREAD_ENV, cpu_environment
from verl_mm_tools.errors import ConfigError, VerlMMToolsError, did_you_mean
from verl_mm_tools.supervise import kill_group, supervised, write_trainer_script

logger = logging.getLogger(__name__)

SFT_TRAINER_MODULE = "verl.trainer.sft_trainer"
CHECKPOINTS_DIR = "checkpoints"  # trainer.default_local_dir, under out_dir
LOG_FILE = "sft_trainer.log"  # the trainer's stdout and stderr, under out_dir
COMMAND_FILE = "command.sh"  # the exact command, to rerun or edit, under out_dir
# the environment variables command.sh sets before the command, and its comment
SCRIPT_ENV = ("VERL_PLATFORM", "VERL_ENGINE_DEVICE", "TOKENIZERS_PARALLELISM", *THREAD_ENV)
SCRIPT_COMMENT = "verl's SFT trainer on CPU (verl_mm_tools.cpu.sft)."
HF_MODEL = "hf_model"  # the checkpoint content verl saves as a Hugging Face model folder
LATEST_STEP_FILE = "latest_checkpointed_iteration.txt"  # verl's checkpoint tracker
TAIL_LINES = 25

# (override, why)
CPU_SFT_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("trainer.device=cpu", "the trainer places batches and metrics on this device"),
    (
        "engine.strategy=fsdp2",
        "verl's default FSDP1 refuses a model on CPU ('has CPU parameters or buffers when sync_module_states=True, "
        "which requires them to be on GPU'); FSDP2 runs on gloo",
    ),
    (
        "+engine.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "verl computes in bf16 by default: the loss is then not the fp32 model's (first step on the tiny model: 6.906 "
        "vs 6.8916), and bf16 is no faster on CPU",
    ),
    ("engine.use_torch_compile=false", "compiling costs more than it saves on CPU"),
    (
        "+model.override_config.attn_implementation=sdpa",
        "no flash-attention on CPU: verl asks for flash_attention_2 and transformers refuses at model load",
    ),
    (
        "model.use_remove_padding=false",
        "verl's packed-sequence attention needs flash-attention (NameError: _flash_use_top_left_mask); without it "
        "the engine pads each micro-batch (the packed no_padding data is unpacked)",
    ),
    ("data.pad_mode=no_padding", "the only layout verl's FSDP engine accepts (it asserts it); verl's default too"),
    (
        "model.enable_gradient_checkpointing=false",
        "recomputing activations saves memory a CPU-sized model does not need, and costs time",
    ),
    ("data.num_workers=0", "each dataloader worker is another process (default 8)"),
    (
        "data.enable_thinking_default=null",
        "verl's default is the string 'none', which the dataset reads as enable_thinking=True and passes to the chat "
        "template of every row; null passes it only for rows whose enable_thinking column sets it",
    ),
    ("trainer.logger=[console]", "verl's default adds wandb, which needs an account and the network"),
    ("trainer.save_freq=-1", "one checkpoint, after the last step"),
    ("trainer.resume_mode=disable", "a fresh run (run_verl_sft refuses an out_dir holding checkpoints)"),
)


SFT_OVERRIDES = Adaptation(
    section=Section.CONFIGURATION,
    what="the hydra overrides and launch of `verl.trainer.sft_trainer` on CPU, each override with its "
    "reason (e.g. `engine.strategy=fsdp2`: FSDP1 refuses CPU parameters with `sync_module_states`; "
    "`model.use_remove_padding=false`: verl's packed attention needs flash-attention; "
    "`data.enable_thinking_default=null`: verl's default is the string `'none'`, which the dataset "
    "reads as `enable_thinking=True`); torchrun with `cpu_environment()`; enough "
    "`trainer.total_epochs` to reach the steps",
    why="verl's SFT defaults assume GPUs (bf16, FSDP1, flash-attention, wandb, 8 dataloader workers), "
    "and it saves only at the last step, which `total_epochs` (default 4) may stop short of",
    applies_to="verl 0.9.1",
    proof="none; the overrides compose with verl's config and train: `tests/cpu/test_verl_sft_on_cpu.py`",
)


class VerlSFTError(VerlMMToolsError, RuntimeError):
    """verl's SFT trainer failed, or finished without the Hugging Face model it was asked to save."""


@dataclass(frozen=True)
class SFTKnobs:
    """What a CPU run may choose; defaults fit the tiny models (seconds per dozen steps)."""

    steps: int = 40
    batch_size: int = 4  # rows per step (verl's data.train_batch_size)
    # the tiny random model's rate (the demo's warm start uses it): it fits a 20-token tool call in ~30 steps;
    # a pretrained model wants verl's 1e-5..1e-3
    lr: float = 1e-2
    seed: int = 0
    max_length: int = 1024  # tokens per row; a longer row is an error (verl's truncation: error)
    max_token_len_per_gpu: int = 8192  # tokens per micro-batch (verl's dynamic batch size)
    save_contents: tuple[str, ...] = (HF_MODEL,)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "max_length", "max_token_len_per_gpu"):
            if getattr(self, name) < 1:
                raise ConfigError(f"verl SFT: {name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"verl SFT: lr must be > 0, got {self.lr}")
        if HF_MODEL not in self.save_contents:
            raise ConfigError(
                f"verl SFT: save_contents {list(self.save_contents)} lacks {HF_MODEL!r}, the Hugging Face model "
                f"run_verl_sft returns; add it (verl's others: model, optimizer, extra)"
            )


def sft_knobs(knobs: dict) -> SFTKnobs:
    fields = [field.name for field in dataclasses.fields(SFTKnobs)]
    for name in knobs:
        if name not in fields:
            raise ConfigError(f"verl SFT: unknown knob {name!r}; known: {fields}.{did_you_mean(name, fields)}")
    return SFTKnobs(**knobs)


@SFT_OVERRIDES.implements
def sft_overrides(
    model_path: str | os.PathLike,
    train_files: str | os.PathLike | Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    **knobs: object,
) -> list[str]:
    """The hydra overrides for ``verl.trainer.sft_trainer`` on CPU: ``CPU_SFT_OVERRIDES``, then the model, data,
    schedule and checkpoint (``trainer.default_local_dir`` is ``out_dir/checkpoints``). ``knobs``: ``SFTKnobs``."""
    chosen = sft_knobs(knobs)
    files = train_file_list(train_files)
    epochs = epochs_for(chosen.steps, chosen.batch_size, files)
    return [
        *(override for override, _ in CPU_SFT_OVERRIDES),
        f"model.path={hydra_string(model_path)}",
        f"data.train_files={hydra_list(files)}",
        f"data.train_batch_size={chosen.batch_size}",
        f"data.micro_batch_size_per_gpu={chosen.batch_size}",
        f"data.max_token_len_per_gpu={chosen.max_token_len_per_gpu}",
        f"data.max_length={chosen.max_length}",
        f"optim.lr={chosen.lr!r}",
        f"engine.seed={chosen.seed}",
        f"trainer.seed={chosen.seed}",
        f"trainer.total_training_steps={chosen.steps}",
        # verl stops at whichever comes first, and saves only at the last step: enough epochs to reach it
        f"trainer.total_epochs={epochs}",
        f"checkpoint.save_contents=[{','.join(chosen.save_contents)}]",
        f"trainer.default_local_dir={hydra_string(Path(out_dir) / CHECKPOINTS_DIR)}",
    ]


def train_file_list(train_files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    listed = [train_files] if isinstance(train_files, str | os.PathLike) else list(train_files)
    files = [Path(path) for path in listed]
    if not files:
        raise ConfigError("verl SFT: no train_files given; give the parquet export-sft wrote (sft/train.parquet)")
    missing = [str(path) for path in files if not path.is_file()]
    if missing:
        raise ConfigError(f"verl SFT: train_files {missing} do not exist; give parquet files (export-sft writes one)")
    return files


def epochs_for(steps: int, batch_size: int, files: list[Path]) -> int:
    """Epochs that hold ``steps`` steps: verl drops each epoch's last partial batch."""
    import pyarrow.parquet

    rows = sum(pyarrow.parquet.read_metadata(path).num_rows for path in files)
    steps_per_epoch = rows // batch_size
    if steps_per_epoch == 0:
        raise ConfigError(
            f"verl SFT: {[str(path) for path in files]} hold {rows} rows, fewer than one batch of {batch_size}: "
            "verl would train on nothing; give a smaller batch_size or more rows"
        )
    return math.ceil(steps / steps_per_epoch)


def hydra_string(value: str | os.PathLike) -> str:
    """A hydra override value taken literally (spaces, commas and brackets included)."""
    return "'" + str(value).replace("'", "\\'") + "'"


def hydra_list(values: Sequence[str | os.PathLike]) -> str:
    return "[" + ",".join(hydra_string(value) for value in values) + "]"


def sft_command(overrides: Sequence[str]) -> list[str]:
    """verl's documented launch: torchrun (as a module of this interpreter), one process."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=1"]
    return [*torchrun, "-m", SFT_TRAINER_MODULE, *overrides]


@SFT_OVERRIDES.implements
def run_verl_sft(
    model_path: str | os.PathLike,
    train_files: str | os.PathLike | Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    overrides: Sequence[str] = (),
    timeout_s: float | None = None,
    **knobs: object,
) -> Path:
    """Train ``model_path`` on ``train_files`` with verl's SFT trainer on CPU; return the Hugging Face model folder
    it saved after the last step. ``overrides`` (hydra) come last and win; ``knobs``: ``SFTKnobs``. Writes
    ``out_dir/command.sh``, ``out_dir/sft_trainer.log`` and ``out_dir/checkpoints/``."""
    out_dir = Path(out_dir)
    refuse_earlier_checkpoints(out_dir / CHECKPOINTS_DIR)
    command = sft_command([*sft_overrides(model_path, train_files, out_dir, **knobs), *overrides])
    env = cpu_environment()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_trainer_script(out_dir / COMMAND_FILE, command, env, SCRIPT_ENV, SCRIPT_COMMENT)
    started = time.monotonic()
    returncode = run_logged(command, env, out_dir / LOG_FILE, timeout_s)
    if returncode != 0:
        raise VerlSFTError(failure_message(f"exited with status {returncode}", out_dir))
    model_dir = saved_hf_model(out_dir)
    log_summary(out_dir / LOG_FILE, time.monotonic() - started, model_dir)
    return model_dir


def refuse_earlier_checkpoints(checkpoints: Path) -> None:
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        raise ConfigError(
            f"verl SFT: {checkpoints} holds checkpoints of an earlier run; give an empty out_dir or remove that folder"
        )


def run_logged(command: list[str], env: dict[str, str], log_path: Path, timeout_s: float | None) -> int:
    """Run ``command`` with its output in ``log_path``; on a timeout or an interruption, kill its whole process
    group (torchrun and the trainer it started)."""
    logger.info("verl SFT: %s (log: %s)", shlex.join(command), log_path)
    try:
        with supervised(command, env, log_path, stop=kill_group) as process:
            return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        raise VerlSFTError(failure_message(f"ran past its {timeout_s} s and was killed", log_path.parent)) from None


def failure_message(what: str, out_dir: Path) -> str:
    return (
        f"verl's SFT trainer {what}. Command: {out_dir / COMMAND_FILE}; full log: {out_dir / LOG_FILE}; its end:\n"
        + "\n".join(trainer_error_tail(out_dir / LOG_FILE))
    )


def trainer_error_tail(log_path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last lines of the trainer's own output: torchrun's report that follows it names no cause."""
    text = log_path.read_text(errors="replace").splitlines() if log_path.exists() else []
    own = [line for line in text if "HYDRA_FULL_ERROR" not in line]
    for index, line in enumerate(own):
        if "torch/distributed/elastic/multiprocessing/api.py" in line:  # torchrun: "failed (exitcode: 1) ..."
            own = own[:index]
            break
    return own[-lines:]


def saved_hf_model(out_dir: Path) -> Path:
    """verl writes ``global_step_N/huggingface`` under ``trainer.default_local_dir`` and N to its tracker file."""
    checkpoints = out_dir / CHECKPOINTS_DIR
    tracker = checkpoints / LATEST_STEP_FILE
    if not tracker.is_file():
        raise VerlSFTError(failure_message(f"finished but left no checkpoint tracker ({tracker})", out_dir))
    model_dir = checkpoints / f"global_step_{tracker.read_text().strip()}" / "huggingface"
    if not (model_dir / "config.json").is_file() or not any(model_dir.glob("*.safetensors")):
        raise VerlSFTError(
            failure_message(
                f"finished but {model_dir} holds no Hugging Face model (config.json, *.safetensors)", out_dir
            )
        )
    return model_dir


# tqdm's progress bar (stderr, same log) often precedes it on the line
STEP_LINE = re.compile(r"(?:^|\W)step:(\d+) - (.*)$")


def trainer_steps(log_path: str | os.PathLike) -> list[dict]:
    """The metrics verl's console logger printed, one dict per step (``step``, ``train/loss``, ...)."""
    steps = []
    for line in Path(log_path).read_text(errors="replace").splitlines():
        match = STEP_LINE.search(line)
        if match:
            metrics = dict(item.split(":", 1) for item in match.group(2).split(" - ") if ":" in item)
            steps.append({"step": int(match.group(1)), **{key: _number(value) for key, value in metrics.items()}})
    return steps


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text.strip()


def log_summary(log_path: Path, elapsed_s: float, model_dir: Path) -> None:
    steps = trainer_steps(log_path)
    losses = [step["train/loss"] for step in steps if "train/loss" in step]
    if losses:
        logger.info(
            "verl SFT: trained to step %d in %.1f s, loss %.4g -> %.4g; model: %s",
            steps[-1]["step"],
            elapsed_s,
            losses[0],
            losses[-1],
            model_dir,
        )
