"""Figures 5 and 8 of ``verl-mm-tools bench``: verl's real CPU GRPO step, each loop and trainer in its own
subprocess, and vLLM's prefix cache and vision-encoder runs (``bench.engine``, a fresh process)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

from verl_mm_tools.bench.figures import Figure, figure
from verl_mm_tools.step_metrics import GENERATE_S_MAX, PREFIX_CACHE_HIT_RATE

STEP_WARMUP = 2  # the first steps pay one-time costs (compilation of kernels, caches, Ray actor start-up)


# Figure 5's trainer runs: name -> (agent loop, trainer, export, rollout engine)
STEP_RUNS = {
    "tool_agent": ("tool_agent", "sync", "per_trajectory", "hf"),
    "mm_tool": ("mm_tool", "sync", "per_trajectory", "hf"),
    "mm_tool_classic": ("mm_tool", "classic", "per_trajectory", "hf"),
    "mm_tool_per_turn": ("mm_tool", "sync", "per_turn", "hf"),
}
VLLM_STEP_RUN = {"mm_tool_vllm": ("mm_tool", "sync", "per_trajectory", "vllm")}  # with ``--rollout vllm``
# The slowest trajectory's seconds in the engine: verl's own timer on the classic trainer; its v1 trainer drops the
# loops' timers, so there mm_tool's (``mm_tool/generate_s/max``), and none for verl's tool_agent.
CLASSIC_SLOWEST_GENERATION = "timing_s/agent_loop/generate_sequences/max"
OUTSIDE_GENERATION_TARGET = "<= 0.08"  # issue #49: the rollout's CPU work outside generation near zero


def cpu_step(
    out_dir: Path, steps: int = 12, vllm: bool = False, say: Callable[[str], object] = lambda line: None
) -> list[Figure]:
    """Figure 5: one short trainer run each (a subprocess each; they cannot share one process)."""
    from verl_mm_tools.demo.options import DemoOptions
    from verl_mm_tools.demo.run import run_demo_result

    metrics = {}
    for name, (loop, trainer, export, rollout) in {**STEP_RUNS, **(VLLM_STEP_RUN if vllm else {})}.items():
        options = DemoOptions(
            out=out_dir / name,
            task="rotation",
            steps=steps,
            prompts_per_step=8,
            rollouts_per_prompt=4,
            dumps=False,
            trainer=trainer,
            export=export,
            rollout=rollout,
            overrides=(
                f"actor_rollout_ref.rollout.agent.default_agent_loop={loop}",
                "trainer.rollout_data_dir=null",
                "trainer.save_freq=-1",
            ),
        )
        result, _ = run_demo_result(options, cast("Callable[[str], None]", say))  # its result is ignored
        if result.returncode != 0:
            raise RuntimeError(f"the {name} trainer run failed (exit {result.returncode}); see {out_dir / name}")
        metrics[name] = result.steps
    return step_figures(metrics)


def _after_warmup(name: str, steps: list[dict]) -> list[dict]:
    steps = [step for step in steps if step["step"] > STEP_WARMUP and "timing_s/step" in step]
    if not steps:
        raise RuntimeError(f"the {name} run logged no step after the first {STEP_WARMUP}")
    return steps


def step_figures(metrics: dict[str, list[dict]]) -> list[Figure]:
    """Step time after STEP_WARMUP steps per run (``STEP_RUNS``), the ratios of the medians mm_tool / tool_agent
    (same trainer) and v1 / classic (same loop), and for each mm_tool run the share of each step spent in the
    rollout phase (verl's ``timing_s/gen``) outside its slowest trajectory's generation: verl's postprocess, the
    streamed reward, Ray hops and the agent loop's own work. With the vLLM run: its step time over the hf server's
    (same loop and trainer) and the prefix-cache hit rate of its later turns (``mm_tool/prefix_cache_hit_rate``)."""
    figures, medians = [], {}
    for name in metrics:
        steps = _after_warmup(name, metrics[name])
        medians[name] = statistics.median(step["timing_s/step"] for step in steps)
        figures.append(figure(f"step/{name}_s", [step["timing_s/step"] for step in steps]))
        slowest = _slowest_generation(name)
        if slowest is not None:
            shares = [(step["timing_s/gen"] - _logged(name, step, slowest)) / step["timing_s/step"] for step in steps]
            figures.append(figure(f"step/{name}/rollout_outside_generation_share", shares, OUTSIDE_GENERATION_TARGET))
        if name in VLLM_STEP_RUN:
            rates = [step[PREFIX_CACHE_HIT_RATE] for step in steps if PREFIX_CACHE_HIT_RATE in step]
            if not rates:
                raise RuntimeError(f"the {name} run logged no {PREFIX_CACHE_HIT_RATE}: no trajectory had a second turn")
            figures.append(figure(f"step/{name}/prefix_cache_hit_rate", rates))
    # ratios of the runs' medians: steps of different runs are not pairs
    figures.append(figure("step/ratio", [medians["mm_tool"] / medians["tool_agent"]], "<= 1.05"))
    figures.append(figure("step/v1_vs_classic", [medians["mm_tool"] / medians["mm_tool_classic"]], "<= 1.10"))
    figures.append(figure("step/per_turn_vs_per_trajectory", [medians["mm_tool_per_turn"] / medians["mm_tool"]]))
    if "mm_tool_vllm" in medians:
        figures.append(figure("step/vllm_vs_hf", [medians["mm_tool_vllm"] / medians["mm_tool"]], "<= 1.5"))
    return figures


def _slowest_generation(name: str) -> str | None:
    loop, trainer, _, _ = {**STEP_RUNS, **VLLM_STEP_RUN}[name]
    if trainer == "classic":
        return CLASSIC_SLOWEST_GENERATION
    return GENERATE_S_MAX if loop == "mm_tool" else None


def _logged(name: str, step: dict, key: str) -> float:
    if key not in step:
        raise RuntimeError(f"the {name} run's step {step['step']} logged no {key}: is verl-mm-tools' step hook on?")
    return step[key]


def engine_figures(model_dir: str) -> list[Figure]:
    """Figure 8: over a 4-turn trajectory with one more image per turn, the share of the prompt tokens of turns 2-4
    vLLM's prefix cache held, and how many times each image went through the vision encoder."""
    turns = engine_turns(model_dir)
    later = turns[1:]
    hit_rate = sum(turn["cached_tokens"] for turn in later) / sum(turn["prompt_tokens"] for turn in later)
    encodings = sum(turn["images_encoded"] for turn in turns) / turns[-1]["images"]
    return [
        figure("engine/vllm/prefix_cache_hit_rate_from_turn_2", [hit_rate]),
        figure("engine/vllm/encoder_runs_per_image", [encodings], "<= 1"),
    ]


def engine_turns(model_dir: str) -> list[dict]:
    """``bench.engine``'s turns, measured in a fresh process."""
    command = [sys.executable, "-m", "verl_mm_tools.bench.engine", model_dir]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"the vLLM engine measurement failed (exit {done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])  # vLLM logs to stdout too: the turns are the last line
