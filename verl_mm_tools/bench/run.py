"""``verl-mm-tools bench``'s whole run (the figures: the package's docstring), and figure 3: the image ops, timed
in fresh processes (``bench.ops``)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from verl_mm_tools.bench.figures import Figure, figure
from verl_mm_tools.bench.gui import GuiSizes, gui_figures
from verl_mm_tools.bench.loop import export_cost, loop_overhead
from verl_mm_tools.bench.memory import pillow_reusing_image_memory, trajectory_memory
from verl_mm_tools.bench.opencv_ops import opencv_figures
from verl_mm_tools.bench.plugin_import import import_figures
from verl_mm_tools.bench.python_tool import python_tool_figures
from verl_mm_tools.bench.steps import cpu_step, engine_figures
from verl_mm_tools.bench.video import video_figures
from verl_mm_tools.bench.worker_memory import worker_memory


def image_ops(repeats: int = 11, processes: int = 3) -> list[Figure]:
    """Figure 3, from ``processes`` fresh processes (``bench.ops``) of ``ceil(repeats / processes)`` samples each.
    Targets on the ops themselves (512x512, no output cap); the default cap (1280*28*28 px, below 1024x1024) on
    1024x1024 adds a downscale, reported over a 1024x1024 transpose without a target. Ratios pair samples taken in
    the same process: absolute times follow the host (two idle runs differed by 5-10 % on every one), ratios cancel
    it."""
    from verl_mm_tools.bench.ops import BASELINE

    seconds: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    for _ in range(processes):
        samples = _ops_in_fresh_process(math.ceil(repeats / processes))
        for name, values in samples.items():
            baseline = samples[f"default_cap/{BASELINE}" if name.startswith("default_cap/") else BASELINE]
            seconds.setdefault(name, []).extend(values)
            ratios.setdefault(name, []).extend(op / base for op, base in zip(values, baseline))
    ops_names = [name for name in seconds if name != BASELINE and not name.startswith("default_cap/")]
    figures = [figure(f"ops/{BASELINE}_ms", [t * 1e3 for t in seconds[BASELINE]])]
    figures += [figure(f"ops/{name}_over_{BASELINE}", ratios[name], "<= 3") for name in ops_names]
    figures += [
        figure(f"ops/default_cap/{name}_over_{BASELINE}1024", ratios[f"default_cap/{name}"]) for name in ops_names
    ]
    return figures


def _ops_in_fresh_process(repeats: int) -> dict[str, list[float]]:
    command = [sys.executable, "-m", "verl_mm_tools.bench.ops", str(repeats)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"the image-op timing process failed (exit {done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}"
        )
    return json.loads(done.stdout)


@dataclass(frozen=True)
class Repeats:
    """How often each timed figure of figures 1-3, 6 and 12 is sampled: ``ops`` image-op samples, ``loop``
    trajectory pairs for each length (at least; ``pairs_per_size // turns`` where that is more), ``export`` pairs,
    ``video`` decodes of each kind."""

    ops: int
    loop: int
    pairs_per_size: int
    export: int
    video: int

    @classmethod
    def of(cls, quick: bool, repeats: int | None) -> Repeats:
        """The default sizes, the quick ones, or ``repeats`` samples of each (a wider spread, a shorter run): the short
        loop lengths too, which the default sizes give more pairs (``pairs_per_size``)."""
        if repeats is not None:
            return cls(ops=repeats, loop=repeats, pairs_per_size=repeats, export=repeats, video=repeats)
        return cls(ops=11, loop=12, pairs_per_size=96, export=6, video=3) if quick else cls(31, 24, 192, 12, 7)


def run(
    model_dir: str,
    quick: bool = False,
    step_dir: Path | None = None,
    remote: bool = False,
    vllm: bool = False,
    say: Callable[[str], object] = lambda line: None,
    repeats: int | None = None,
) -> list[Figure]:
    """Figures 1-4, 6 and 9-12; figure 5 too when ``step_dir`` is given (the trainer runs write there), figure 7 with
    ``remote`` (``bench.remote``: a local Ray cluster), figure 8 and figure 5's vLLM run with ``vllm``. ``repeats``
    sets every timed figure's sample count (``Repeats.of``; figure 11's: ``GuiSizes.of``)."""
    sizes = Repeats.of(quick, repeats)
    figures = image_ops(repeats=sizes.ops)
    figures += opencv_figures(sizes.ops, processes=min(3, max(1, sizes.ops // 3)), say=say)
    with pillow_reusing_image_memory():
        figures += loop_overhead(model_dir, repeats=sizes.loop, pairs_per_size=sizes.pairs_per_size)
    # with --repeats (a check of the output's shape) a 448 px trajectory part by part: 4 s less than 1024 px
    figures += trajectory_memory(model_dir, resident_side=448 if repeats is not None else 1024)
    if quick or repeats is not None:
        say("bench: the worker memory sweep (1 to 64 trajectories at once, ~2 min) runs without --quick and --repeats")
    else:
        figures += worker_memory(model_dir, say)
    figures += export_cost(model_dir, repeats=sizes.export)
    figures += python_tool_figures(repeats=sizes.loop, say=say)
    figures += gui_figures(GuiSizes.of(quick, repeats), say=say)
    figures += import_figures(pairs=min(sizes.export, 8))
    # with --repeats a 2 s clip (a check of the output's shape), else the 10 s one docs/benchmarks.md reports
    figures += video_figures(repeats=sizes.video, seconds=10 if repeats is None else 2, say=say)
    if step_dir is not None:
        figures += cpu_step(step_dir, steps=6 if quick else 12, vllm=vllm, say=say)
    if remote:
        from verl_mm_tools.bench.remote import remote_figures

        figures += remote_figures(model_dir, quick=quick)
    if vllm:
        figures += engine_figures(model_dir)
    return figures
