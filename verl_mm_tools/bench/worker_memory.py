"""Figure 4's worker sweep: the peak resident memory verl's real ``AgentLoopWorker`` adds while it runs N mm_tool
trajectories at once (16 turns, one new image per turn, the scripted zero-latency server), measured in a fresh
process per run: for N = 1, 8, 32, 64 the slope per trajectory and per image of a least-squares line through the
peaks, how far the peaks stray from it, 64 trajectories of 4 turns against 16 (per image: a copy per turn would grow
it), and 64 trajectories again with glibc's ``MALLOC_MMAP_THRESHOLD_`` fixed (large blocks mapped and unmapped: the
peak then follows the live bytes, freed ones go back to the kernel).

The peak is the kernel's: Linux's ``VmHWM`` (the process's peak RSS), reset after a warm-up trajectory by writing 5
to ``/proc/self/clear_refs``, minus the RSS at that moment, taken after glibc returned its freed blocks to the kernel
(``malloc_trim``): blocks the warm-up freed but kept resident would otherwise absorb a small run (a 2-trajectory run's
peak once equalled its baseline). Beside it, counted like the single-trajectory figure
(``memory.held_bytes``): the bytes the N finished trajectories hold for the trainer (their images' pixels and each
sample's ``multi_modal_inputs``), so the figures say how much of the peak they explain.

``python -m verl_mm_tools.bench.worker_memory MODEL_DIR TRAJECTORIES TURNS SIDE`` prints ``{peak_added_bytes,
counted_bytes, raw_image_bytes, images}`` as JSON.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from verl_mm_tools.bench.figures import Figure, figure
from verl_mm_tools.bench.loop import distinct_script, loop_factory, noise_image
from verl_mm_tools.bench.memory import held_bytes
from verl_mm_tools.runtime.batch import image_prompt, make_batch
from verl_mm_tools.runtime.workers import generate
from verl_mm_tools.testkit.scripted import ScriptedServer

if TYPE_CHECKING:
    from transformers import ProcessorMixin
    from verl.protocol import DataProto
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import TokenOutput

CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")
RESET_PEAK = "5"  # Linux (>= 4.0): VmHWM starts again from the current RSS
SWEEP = (1, 8, 32, 64)
TURNS, FEWER_TURNS, SIDE = 16, 4, 224  # 224 px: 64 x 16 images fit a shared machine (~3 GB; 1024 px would take ~56)
FIXED_MMAP_THRESHOLD = {"MALLOC_MMAP_THRESHOLD_": "131072"}  # glibc's default start, no longer raised as blocks free


class UnrecordedServer(ScriptedServer):
    """The scripted server without its record of requests (every prompt's token ids and images, kept for tests'
    checks): over N trajectories x turns it would grow, and be counted as the worker's memory."""

    async def generate(self, request_id: str, **kwargs: Any) -> TokenOutput:
        try:
            return await super().generate(request_id, **kwargs)
        finally:
            self.requests.clear()


def peak_reset_available() -> str | None:
    """None when this process can reset and read its peak RSS, else why not (a line for the reader)."""
    try:
        CLEAR_REFS.write_text(RESET_PEAK)
        _status_bytes("VmHWM")
    except (OSError, AttributeError) as error:
        return f"the peak RSS cannot be reset here ({CLEAR_REFS}, Linux only): {error}"
    return None


def _status_bytes(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", STATUS.read_text(), re.MULTILINE)
    if match is None:
        raise AttributeError(f"{STATUS} has no {field} line")
    return int(match.group(1)) * 1024


def _batch(trajectories: int, side: int, first_seed: int = 0) -> DataProto:
    """``trajectories`` prompts, each of its own noise image (with ``distinct_script``, no two images alike: a worker
    holds an image it already holds once)."""
    prompts = [
        image_prompt("How far is this image rotated?", [noise_image(side, seed)])
        for seed in range(first_seed, first_seed + trajectories)
    ]
    return make_batch(prompts, agent_name=["mm_tool"] * trajectories)


def worker_run(model_dir: str, trajectories: int, turns: int, side: int) -> dict[str, int]:
    """One warm-up trajectory, then ``trajectories`` at once through one ``generate_sequences`` call: the peak RSS
    that call added, and what its output holds."""
    script = distinct_script(turns)
    with tempfile.TemporaryDirectory() as workdir:
        _, tokenizer, worker = loop_factory(model_dir, Path(workdir), side, turns)
        worker.llm_client = cast("LLMServerClient", UnrecordedServer(tokenizer, script))  # a stand-in for it
        # first-call costs (imports, caches) are not the trajectories'
        generate(worker, _batch(1, side, first_seed=trajectories))
        gc.collect()
        _return_freed_blocks()
        baseline = _status_bytes("VmRSS")
        CLEAR_REFS.write_text(RESET_PEAK)
        output = generate(worker, _batch(trajectories, side))
        peak = _status_bytes("VmHWM")
        return {"peak_added_bytes": peak - baseline, **_held_for_the_trainer(output, worker.processor)}


def _return_freed_blocks() -> None:
    """glibc's ``malloc_trim(0)``: freed heap blocks go back to the kernel (elsewhere nothing happens)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _held_for_the_trainer(output: DataProto, processor: ProcessorMixin) -> dict[str, int]:
    """Counted from the output: every sample's ``multi_modal_inputs``, plus its images' pixels as Pillow holds them
    (4 bytes per RGB pixel; the batch does not carry the images, the finished trajectories did)."""
    inputs = list(output.non_tensor_batch["multi_modal_inputs"])
    patch = processor.image_processor.patch_size
    pixels = sum(int(grid.prod(dim=1).sum()) * patch * patch for grid in (each["image_grid_thw"] for each in inputs))
    images = sum(len(each["image_grid_thw"]) for each in inputs)
    return {"counted_bytes": held_bytes(inputs) + 4 * pixels, "raw_image_bytes": 3 * pixels, "images": images}


def worker_memory(model_dir: str, say: Callable[[str], object] = lambda line: None) -> list[Figure]:
    """The sweep's figures (see the module docstring); none, with a line saying why, where the peak RSS cannot be
    reset (not Linux)."""
    why = peak_reset_available()
    if why is not None:
        say(f"bench: the worker memory sweep is skipped: {why}")
        return []
    runs = {count: _in_fresh_process(model_dir, count, TURNS) for count in SWEEP}
    fewer_turns = _in_fresh_process(model_dir, SWEEP[-1], FEWER_TURNS)
    fixed = _in_fresh_process(model_dir, SWEEP[-1], TURNS, FIXED_MMAP_THRESHOLD)
    return sweep_figures(runs, fewer_turns, fixed)


def sweep_figures(runs: dict[int, dict], fewer_turns: dict, fixed: dict) -> list[Figure]:
    """The figures from the runs' JSON: ``runs`` by trajectory count (``TURNS`` each), ``fewer_turns`` and ``fixed``
    (``FIXED_MMAP_THRESHOLD``) at the largest count."""
    name, most = f"memory/worker/{TURNS}x{SIDE}px", max(runs)
    slope, intercept = _line(list(runs), [run["peak_added_bytes"] for run in runs.values()])
    stray = max(abs(run["peak_added_bytes"] - (slope * count + intercept)) for count, run in runs.items())
    raw_per_image = runs[most]["raw_image_bytes"] / runs[most]["images"]
    per_image = {"16": _per_image(runs[most]), "4": _per_image(fewer_turns)}
    figures = [
        figure(f"{name}/{count}_trajectories_peak_added_MB", [runs[count]["peak_added_bytes"] / 2**20])
        for count in runs
    ]
    return figures + [
        figure(f"{name}/peak_per_trajectory_MB", [slope / 2**20]),
        figure(f"{name}/peak_per_image_over_raw", [slope / TURNS / raw_per_image], "<= 3"),
        figure(
            f"{name}/counted_per_image_over_raw", [runs[most]["counted_bytes"] / runs[most]["images"] / raw_per_image]
        ),
        figure(f"{name}/peak_off_the_line_share", [stray / runs[most]["peak_added_bytes"]], "<= 0.2"),
        figure(f"{name}/per_image_{TURNS}_over_{FEWER_TURNS}_turns", [per_image["16"] / per_image["4"]], "<= 1.25"),
        figure(
            f"{name}/{most}_trajectories_fixed_mmap_threshold_peak_over_counted",
            [fixed["peak_added_bytes"] / fixed["counted_bytes"]],
        ),
    ]


def _per_image(run: dict) -> float:
    return run["peak_added_bytes"] / run["images"]


def _line(xs: list[int], ys: list[int]) -> tuple[float, float]:
    """Least squares: the slope and intercept of the line through the points."""
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return slope, mean_y - slope * mean_x


def _in_fresh_process(model_dir: str, trajectories: int, turns: int, env: dict[str, str] | None = None) -> dict:
    command = [
        sys.executable,
        "-m",
        "verl_mm_tools.bench.worker_memory",
        model_dir,
        str(trajectories),
        str(turns),
        str(SIDE),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(
            f"the worker memory process failed (exit {done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}"
        )
    return json.loads(done.stdout)


def main(argv: list[str]) -> None:
    if len(argv) != 4 or not all(value.isdigit() and int(value) > 0 for value in argv[1:]):
        raise SystemExit(
            "usage: python -m verl_mm_tools.bench.worker_memory MODEL_DIR TRAJECTORIES TURNS SIDE "
            f"(positive integers), got {argv}"
        )
    model_dir, trajectories, turns, side = argv[0], *(int(value) for value in argv[1:])
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON only (verl prints to it)
        figures = worker_run(model_dir, trajectories, turns, side)
    json.dump(figures, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
