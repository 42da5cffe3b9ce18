"""``verl-mm-tools bench``: side-by-side measurements, one line per figure: ``name value target PASS|FAIL``.

1. mm_tool against verl's ``tool_agent`` on the same scripted zero-latency server and the same tool, 1/4/8/16 turns
   with one new image per turn, small (56 px) and 448x448 images (processor limits raised so they really yield 256
   image tokens): median CPU time (all threads of the process: verl tokenizes in an executor) per trajectory of
   building the agent loop (verl builds one per trajectory) and its ``run()``, and the median ratio of the
   interleaved pairs. CPU time, not wall time: the machines this runs on are shared.
2. Per-turn cost at turn 16 divided by turn 2, for both loops (a loop that re-renders the conversation grows).
3. Each image op on a 1024x1024 RGB image, median, divided by PIL ``transpose`` of the same image.
4. Peak resident memory added by a 16-image mm_tool trajectory divided by the raw bytes of its images.
5. (``--step``) verl's real CPU GRPO step (the rotation demo, 8 prompts x 4 rollouts, <= 3 turns, dumps off): trainer
   runs with verl's ``tool_agent`` and with ``mm_tool`` on verl's default v1 trainer (sync), then ``mm_tool`` on the
   classic trainer: median step time after warm-up, the ratios mm_tool / tool_agent and v1 / classic, and (classic
   only: the v1 trainer does not log the slowest trajectory) the share of the step the rollout phase spends outside
   the slowest trajectory's generation.
"""

from __future__ import annotations

import contextlib
import gc
import io
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from verl_mm_tools.agent_loop.harness import (
    ROTATE_TOOLS_YAML,
    LocalRollout,
    ScriptedServer,
    image_prompt,
    make_worker,
    tool_call_text,
)

LOOPS = ("tool_agent", "mm_tool")


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    target: str  # e.g. "<= 1.05"

    @property
    def passed(self) -> bool:
        op, bound = self.target.split()
        return self.value <= float(bound) if op == "<=" else self.value >= float(bound)

    def line(self) -> str:
        return f"{self.name} {self.value:.4g} {self.target.replace(' ', '')} {'PASS' if self.passed else 'FAIL'}"


class TimedServer(ScriptedServer):
    """The scripted server, recording when each request arrived (per-turn loop cost = time between requests)."""

    def __init__(self, tokenizer, turns):
        super().__init__(tokenizer, turns)
        self.arrivals: list[float] = []

    async def generate(self, request_id, **kwargs):
        self.arrivals.append(time.process_time())
        return await super().generate(request_id, **kwargs)


def _loop_factory(model_dir: str, workdir: Path, side: int, turns: int):
    """A function making a fresh loop of a given name, on a config sized for ``turns`` images of ``side`` px."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry

    tools_yaml = workdir / "tools.yaml"
    tools_yaml.write_text(ROTATE_TOOLS_YAML)
    pixels = side * side
    extra = [f"+data.mm_processor_kwargs.max_pixels={pixels}", "+data.mm_processor_kwargs.min_pixels=784"]
    response_length = turns * ((side // 28) ** 2 + 80) + 64
    config = LocalRollout(model_dir, tools_yaml, workdir).config(
        prompt_length=(side // 28) ** 2 + 512, response_length=response_length, max_turns=turns + 1,
        extra=[*extra, "actor_rollout_ref.rollout.multi_turn.max_user_turns=100"],
    )
    with contextlib.redirect_stdout(io.StringIO()):  # verl prints "Using dataset class ..." on stdout
        worker = make_worker(config, None)

    def make(name: str, server):
        return hydra.utils.instantiate(
            config=_agent_loop_registry[name], trainer_config=DictConfigWrap(config), server_manager=server,
            tokenizer=worker.tokenizer, processor=worker.processor, hf_model_type=worker.hf_model_type,
            dataset_cls=worker.dataset_cls, data_config=DictConfigWrap(config.data), tools=ToolListWrap(worker.tools),
        )

    return make, worker.tokenizer


def _script(turns: int) -> list[str]:
    return [tool_call_text("rotate", degrees=90)] * (turns - 1) + ["<answer>90</answer><|im_end|>"]


def _one_trajectory(make, tokenizer, name: str, turns: int, side: int, loop) -> tuple[float, list[float]]:
    server = TimedServer(tokenizer, _script(turns))
    prompt = image_prompt("How far is this image rotated?", [Image.new("RGB", (side, side), (90, 120, 30))])
    started = time.process_time()
    agent = make(name, server)  # timed too: verl builds a loop for every trajectory
    output = loop.run_until_complete(agent.run({"temperature": 1.0, "logprobs": True}, raw_prompt=prompt))
    elapsed = time.process_time() - started
    if len(output.multi_modal_data.get("images", [])) != turns:
        raise RuntimeError(f"{name} made {len(output.multi_modal_data.get('images', []))} images, expected {turns}")
    gaps = [b - a for a, b in zip(server.arrivals, server.arrivals[1:])]
    return elapsed, gaps


def loop_overhead(model_dir: str, repeats: int = 5) -> list[Figure]:
    from verl.utils.ray_utils import get_event_loop

    figures, loop = [], get_event_loop()
    for side in (56, 448):
        with tempfile.TemporaryDirectory() as workdir:
            make, tokenizer = _loop_factory(model_dir, Path(workdir), side, 16)
            for name in LOOPS:  # warm-up: first-call costs (imports, caches) are not per-trajectory costs
                _one_trajectory(make, tokenizer, name, 2, side, loop)
            for turns in (1, 4, 8, 16):
                elapsed, per_turn = {}, {}
                for _ in range(max(repeats, 96 // turns)):  # interleaved: both loops see the same machine load
                    for name in LOOPS:
                        seconds, gaps = _one_trajectory(make, tokenizer, name, turns, side, loop)
                        elapsed.setdefault(name, []).append(seconds)
                        per_turn.setdefault(name, []).append(gaps)
                for name in LOOPS:
                    figures.append(Figure(f"loop/{side}px/{turns}turns/{name}_ms",
                                          statistics.median(elapsed[name]) * 1e3, "<= inf"))
                # the median of the pairs' ratios: a neighbour's burst slows one pair, not the figure
                ratios = [ours / theirs for ours, theirs in zip(elapsed["mm_tool"], elapsed["tool_agent"])]
                figures.append(Figure(f"loop/{side}px/{turns}turns/ratio", statistics.median(ratios), "<= 1.05"))
                if turns == 16:
                    figures += _growth(side, per_turn)
    return figures


def _growth(side: int, per_turn: dict[str, list[list[float]]]) -> list[Figure]:
    figures = []
    for name, runs in per_turn.items():
        turn2 = statistics.median(gaps[1] for gaps in runs)
        turn16 = statistics.median(gaps[14] for gaps in runs)
        figures.append(Figure(f"loop/{side}px/{name}_turn_ms(t2)", turn2 * 1e3, "<= inf"))
        target = "<= 1.15" if name == "mm_tool" else "<= inf"
        figures.append(Figure(f"loop/{side}px/{name}_turn16_over_turn2", turn16 / turn2, target))
    return figures


def image_ops(repeats: int = 15) -> list[Figure]:
    """Targets on the ops themselves (an output cap above 1024x1024); the default cap (1280*28*28 px, below
    1024x1024) adds a downscale, reported without a target."""
    from verl_mm_tools import ops

    image = Image.new("RGB", (1024, 1024), (10, 20, 30))
    image.paste((200, 40, 40), (100, 100, 600, 500))
    box = (100, 100, 612, 612)
    cases = {
        "rotate90": lambda cap: ops.rotate(image, 90, max_pixels=cap),
        "rotate37": lambda cap: ops.rotate(image, 37, max_pixels=cap),  # bicubic, RotateTool's default
        "rotate37_nearest": lambda cap: ops.rotate(image, 37, max_pixels=cap, resample="nearest"),
        "flip": lambda cap: ops.flip(image, "horizontal", max_pixels=cap),
        "crop": lambda cap: ops.crop(image, box, max_pixels=cap),
        "zoom_in": lambda cap: ops.zoom_in(image, box, max_pixels=cap),
        "draw_bbox": lambda cap: ops.draw_bbox(image, box, label="target", max_pixels=cap),
        "draw_line": lambda cap: ops.draw_line(image, (0, 0, 1023, 1023), width=4, max_pixels=cap),
    }
    base = _median_time(lambda: image.transpose(Image.Transpose.ROTATE_90), repeats)
    figures = [Figure("ops/transpose_ms", base * 1e3, "<= inf")]
    for name, op in cases.items():
        figures.append(Figure(f"ops/{name}_over_transpose", _median_time(lambda: op(1 << 22), repeats) / base, "<= 3"))
    for name, op in cases.items():
        figures.append(Figure(f"ops/default_cap/{name}_ms", _median_time(lambda: op(ops.DEFAULT_MAX_PIXELS), repeats) * 1e3, "<= inf"))
    return figures


def _median_time(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def trajectory_memory(model_dir: str, images: int = 16, side: int = 448) -> list[Figure]:
    """Peak resident memory added by one 16-image trajectory (Linux: VmHWM after resetting it), over the raw bytes
    of its images. Counts what tracemalloc cannot see: PIL pixel buffers and torch tensors."""
    from verl.utils.ray_utils import get_event_loop

    with tempfile.TemporaryDirectory() as workdir:
        make, tokenizer = _loop_factory(model_dir, Path(workdir), side, images)
        loop = get_event_loop()
        _one_trajectory(make, tokenizer, "mm_tool", images, side, loop)  # warm caches outside the measurement
        gc.collect()
        baseline = _reset_peak_rss()
        _one_trajectory(make, tokenizer, "mm_tool", images, side, loop)
        peak = _proc_status_kb("VmHWM") * 1024
    raw = images * side * side * 3
    return [Figure("memory/16_images_peak_added_MB", (peak - baseline) / 2**20, "<= inf"),
            Figure("memory/peak_added_over_raw_image_bytes", (peak - baseline) / raw, "<= 2")]


def _reset_peak_rss() -> int:
    """Reset the process's peak RSS to its current RSS (Linux clear_refs 5); returns the current RSS in bytes."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    return _proc_status_kb("VmRSS") * 1024


def _proc_status_kb(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


STEP_WARMUP = 2  # the first steps pay one-time costs (compilation of kernels, caches, Ray actor start-up)


# Figure 5's trainer runs: name -> (agent loop, trainer)
STEP_RUNS = {"tool_agent": ("tool_agent", "sync"), "mm_tool": ("mm_tool", "sync"),
             "mm_tool_classic": ("mm_tool", "classic")}


def cpu_step(out_dir: Path, steps: int = 12, say=lambda line: None) -> list[Figure]:
    """Figure 5: one short trainer run each (a subprocess each; they cannot share one process)."""
    from verl_mm_tools.cpu.demo import DemoOptions, run_demo_result

    metrics = {}
    for name, (loop, trainer) in STEP_RUNS.items():
        options = DemoOptions(out=out_dir / name, task="rotation", steps=steps, prompts_per_step=8,
                              rollouts_per_prompt=4, dumps=False, trainer=trainer,
                              overrides=(f"actor_rollout_ref.rollout.agent.default_agent_loop={loop}",
                                         "trainer.rollout_data_dir=null", "trainer.save_freq=-1"))
        result, _ = run_demo_result(options, say)
        if result.returncode != 0:
            raise RuntimeError(f"the {name} trainer run failed (exit {result.returncode}); see {out_dir / name}")
        metrics[name] = result.steps
    return step_figures(metrics)


def step_figures(metrics: dict[str, list[dict]]) -> list[Figure]:
    """Median step time after STEP_WARMUP steps per run (``STEP_RUNS``), the ratios mm_tool / tool_agent (same
    trainer) and v1 / classic (same loop), and for the classic run the mean share of each step spent in the rollout
    phase (verl's ``timing_s/gen``) outside its slowest trajectory's generation: verl's postprocess, the streamed
    reward, Ray hops and the agent loop's own work."""
    figures, medians = [], {}
    for name in STEP_RUNS:
        steps = [step for step in metrics[name] if step["step"] > STEP_WARMUP and "timing_s/step" in step]
        if not steps:
            raise RuntimeError(f"the {name} run logged no step after the first {STEP_WARMUP}")
        medians[name] = statistics.median(step["timing_s/step"] for step in steps)
        figures.append(Figure(f"step/{name}_s", medians[name], "<= inf"))
        if STEP_RUNS[name][1] == "classic":
            share = statistics.mean(
                (step["timing_s/gen"] - step["timing_s/agent_loop/generate_sequences/max"]) / step["timing_s/step"]
                for step in steps)
            figures.append(Figure(f"step/{name}/rollout_outside_generation_share", share, "<= 0.1"))
    figures.append(Figure("step/ratio", medians["mm_tool"] / medians["tool_agent"], "<= 1.05"))
    figures.append(Figure("step/v1_vs_classic", medians["mm_tool"] / medians["mm_tool_classic"], "<= 1.10"))
    return figures


def run(model_dir: str, quick: bool = False, step_dir: Path | None = None, say=lambda line: None) -> list[Figure]:
    """Figures 1-4; figure 5 too when ``step_dir`` is given (the trainer runs write there)."""
    figures = image_ops(repeats=5 if quick else 15)
    figures += loop_overhead(model_dir, repeats=2 if quick else 5)
    figures += trajectory_memory(model_dir)
    if step_dir is not None:
        figures += cpu_step(step_dir, steps=6 if quick else 12, say=say)
    return figures
