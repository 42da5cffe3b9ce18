"""``verl-mm-tools bench``: side-by-side measurements, one line per figure, then a one-line summary.

Each figure is the median of repeated measurements, printed with its spread: ``name: median 1.02 (min 0.98, max
1.07, n=24)``; a check adds its target, ``, target <= 1.05: met`` (or ``MISSED``); a figure printed without a spread is
counted or derived, not timed. The last line: ``N checks met, M missed: NAME (median VALUE > BOUND), ...``.
Timings are CPU time, not wall time (the machines this runs on are shared: a neighbour's burst delays a sample, it
adds little CPU time to it), and each ratio is the median over interleaved pairs (both sides see the same load).

1. mm_tool against verl's ``tool_agent`` on the same scripted zero-latency server and the same tool, 1/4/8/16 turns
   with one new image per turn, small (56 px) and 448x448 images (processor limits raised so they really yield 256
   image tokens): CPU time (all threads of the process: verl tokenizes in an executor) per trajectory of building
   the agent loop (verl builds one per trajectory) and its ``run()``, and the ratio of the interleaved pairs.
2. Per-turn growth in 16-turn trajectories: the loop's own time for turns 14-16 over turns 2-4, per trajectory, for
   both loops (a loop that re-renders the conversation grows).
3. Each image op on a 512x512 RGB image (crops and boxes half its side; zoom_in upscales to 448 px) divided by PIL
   ``transpose`` of the same image, and each op with the tools' default output cap on 1024x1024 (a downscale), timed
   in interleaved pairs in three fresh processes that load nothing but Pillow and the ops (``bench_ops``).
4. The bytes a finished 16-image mm_tool trajectory holds (verl's ``AgentLoopOutput``: its images' pixel buffers,
   token lists, extra fields; counted, so two runs agree exactly) over the raw bytes of its images (3 per pixel;
   Pillow stores an RGB pixel in 4).
5. (``--step``) verl's real CPU GRPO step (the rotation demo, 8 prompts x 4 rollouts, <= 3 turns, dumps off): trainer
   runs with verl's ``tool_agent`` and with ``mm_tool`` on verl's default v1 trainer (sync), then ``mm_tool`` on the
   classic trainer, then ``mm_tool`` with ``export: per_turn`` (v1): step time after warm-up, the ratios of the
   medians mm_tool / tool_agent, v1 / classic and per_turn / per_trajectory, and (classic only: the v1 trainer does
   not log the slowest trajectory) the share of the step the rollout phase spends outside the slowest trajectory's
   generation.
6. What ``export: per_turn`` costs against ``per_trajectory`` on 4- and 8-turn trajectories (448 px images): the
   tokens the trainer processes per trajectory (every sample's prompt and response; counted) and the trained ones
   (equal: the same generated tokens), and the ratio of the loop's CPU time per trajectory over interleaved pairs.
   A per-turn sample re-encodes the whole history as its prompt, and the loop re-renders it (the processor runs on
   every image again) before every turn.
7. (``--remote``) tools on Ray actor pools: a blocking tool's wall time in process and on 1, 2, 4 actors, and what an
   image costs to cross to an actor and back (``bench_remote``).
8. (``--rollout vllm``) verl's vLLM rollout: with ``--step``, figure 5's mm_tool run again on vLLM, its step time
   over the hf server's and the prefix-cache hit rate of its turns after the first (from verl's server, during
   training); and over a 4-turn trajectory with an image per turn, vLLM's prefix-cache hit rate from turn 2 on and
   the vision-encoder runs per image (``bench_engine``).
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FunctionType, ModuleType

from PIL import Image

from verl_mm_tools.agent_loop.harness import (
    LocalRollout,
    ScriptedServer,
    image_prompt,
    make_worker,
    restored_loop_registry,
    tool_call_text,
)
from verl_mm_tools.agent_loop.hook_config import MANAGER_TQ_OVERRIDE
from verl_mm_tools.agent_loop.stats import PREFIX_CACHE_HIT_RATE
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

LOOPS = ("tool_agent", "mm_tool")


@dataclass(frozen=True)
class Figure:
    """One figure: the median of its ``samples`` (a single sample: counted or derived, not timed). With a
    ``target`` (e.g. ``"<= 1.05"``) it is a check, met or missed; without one it is informational."""

    name: str
    samples: tuple[float, ...]
    target: str | None = None

    def __post_init__(self):
        if not self.samples:
            raise ValueError(f"figure {self.name!r} has no samples; measure at least once")
        if self.target is not None and (len(self.target.split()) != 2 or self.target.split()[0] not in ("<=", ">=")):
            raise ValueError(f"figure {self.name!r}: target must look like '<= 1.05' or '>= 2', got {self.target!r}")

    @property
    def value(self) -> float:
        return statistics.median(self.samples)

    @property
    def missed(self) -> bool:
        if self.target is None:
            return False
        op, bound = self.target.split()
        return not (self.value <= float(bound) if op == "<=" else self.value >= float(bound))

    def line(self) -> str:
        if len(self.samples) == 1:
            text = f"{self.name}: {self.value:.4g}"
        else:
            text = (
                f"{self.name}: median {self.value:.4g} (min {min(self.samples):.4g}, max {max(self.samples):.4g}, "
                f"n={len(self.samples)})"
            )
        if self.target is not None:
            text += f", target {self.target}: {'MISSED' if self.missed else 'met'}"
        return text

    def reason(self) -> str:
        """Why a check was missed, in a few words: ``median 1.06 > 1.05``."""
        op, bound = self.target.split()
        return f"{'median ' if len(self.samples) > 1 else ''}{self.value:.4g} {'>' if op == '<=' else '<'} {bound}"


def figure(name: str, samples: Sequence[float], target: str | None = None) -> Figure:
    return Figure(name, tuple(float(sample) for sample in samples), target)


def missed(figures: Sequence[Figure]) -> list[Figure]:
    return [each for each in figures if each.missed]


def summary(figures: Sequence[Figure]) -> str:
    """``N checks met, M missed: NAME (REASON), ...``: informational figures are not counted."""
    checks = [each for each in figures if each.target is not None]
    failed = missed(checks)
    text = f"{len(checks) - len(failed)} checks met, {len(failed)} missed"
    return text + (": " + ", ".join(f"{each.name} ({each.reason()})" for each in failed) if failed else "")


class TimedServer(ScriptedServer):
    """The scripted server, recording when each request arrived (per-turn loop cost = time between requests)."""

    def __init__(self, tokenizer, turns):
        super().__init__(tokenizer, turns)
        self.arrivals: list[float] = []

    async def generate(self, request_id, **kwargs):
        self.arrivals.append(time.process_time())
        return await super().generate(request_id, **kwargs)


def _loop_factory(model_dir: str, workdir: Path, side: int, turns: int, export: str = "per_trajectory"):
    """A function making a fresh loop of a given name, on a config sized for ``turns`` images of ``side`` px, mm_tool
    with the given ``export``."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry

    workdir.mkdir(parents=True, exist_ok=True)
    tools_yaml = workdir / "tools.yaml"
    tools_yaml.write_text(ROTATE_TOOLS_YAML)
    pixels = side * side
    extra = [f"+data.mm_processor_kwargs.max_pixels={pixels}", "+data.mm_processor_kwargs.min_pixels=784"]
    if export != "per_trajectory":
        extra += ["trainer.use_v1=true", MANAGER_TQ_OVERRIDE]
    response_length = turns * ((side // 28) ** 2 + 80) + 64
    config = LocalRollout(model_dir, tools_yaml, workdir).config(
        prompt_length=(side // 28) ** 2 + 512,
        response_length=response_length,
        max_turns=turns + 1,
        extra=[*extra, "actor_rollout_ref.rollout.multi_turn.max_user_turns=100"],
        loop_options=None if export == "per_trajectory" else {"export": export},
    )
    with restored_loop_registry(), contextlib.redirect_stdout(io.StringIO()):  # verl prints "Using dataset class"
        worker = make_worker(config, None)
        entries = {name: _agent_loop_registry[name] for name in LOOPS}  # this config's loop options

    def make(name: str, server):
        return hydra.utils.instantiate(
            config=entries[name],
            trainer_config=DictConfigWrap(config),
            server_manager=server,
            tokenizer=worker.tokenizer,
            processor=worker.processor,
            hf_model_type=worker.hf_model_type,
            dataset_cls=worker.dataset_cls,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap(worker.tools),
        )

    return make, worker.tokenizer


def _script(turns: int) -> list[str]:
    return [tool_call_text("rotate", degrees=90)] * (turns - 1) + ["<answer>90</answer><|im_end|>"]


def _one_trajectory(make, tokenizer, name: str, turns: int, side: int, loop):
    """One trajectory: (CPU seconds to build the loop and run it, the gaps between requests, verl's outputs: one, or
    a trajectory's samples with mm_tool's export per_turn)."""
    server = TimedServer(tokenizer, _script(turns))
    prompt = image_prompt("How far is this image rotated?", [Image.new("RGB", (side, side), (90, 120, 30))])
    with _without_gc():
        started = time.process_time()
        agent = make(name, server)  # timed too: verl builds a loop for every trajectory
        output = loop.run_until_complete(agent.run({"temperature": 1.0, "logprobs": True}, raw_prompt=prompt))
        elapsed = time.process_time() - started
    outputs = output if isinstance(output, list) else [output]
    images = len(outputs[-1].multi_modal_data.get("images", []))  # the final sample holds every image
    if images != turns:
        raise RuntimeError(f"{name} made {images} images, expected {turns}")
    gaps = [b - a for a, b in zip(server.arrivals, server.arrivals[1:])]
    return elapsed, gaps, outputs


@contextlib.contextmanager
def _without_gc():
    """No garbage collection while a sample is timed (as ``timeit``): a collection of earlier samples' garbage landing
    in one sample is the likeliest cause of absolute times differing by up to 17 % between runs (not yet confirmed
    by two idle runs). Collected before each sample instead."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# Per-turn growth: gaps[k] is the loop's time before request k + 2 (1-based turns). The first tool turn is left out
# (tool sessions start there); three turns each side, so one slow turn does not decide a trajectory's ratio.
EARLY_TURNS, LATE_TURNS = slice(1, 4), slice(12, 15)  # turns 3-5, turns 14-16


def loop_overhead(model_dir: str, repeats: int = 12, pairs_per_size: int = 96) -> list[Figure]:
    """Figures 1 and 2: ``pairs_per_size // turns`` interleaved trajectory pairs for each length (about as much work
    for each), at least ``repeats``."""
    from verl.utils.ray_utils import get_event_loop

    figures, loop = [], get_event_loop()
    for side in (56, 448):
        with tempfile.TemporaryDirectory() as workdir, _one_torch_thread():
            make, tokenizer = _loop_factory(model_dir, Path(workdir), side, 16)
            for name in LOOPS:  # warm-up: first-call costs (imports, caches) are not per-trajectory costs
                _one_trajectory(make, tokenizer, name, 2, side, loop)
            for turns in (1, 4, 8, 16):
                elapsed, gaps = {name: [] for name in LOOPS}, {name: [] for name in LOOPS}
                for _ in range(max(repeats, pairs_per_size // turns)):  # interleaved: both see the same load
                    for name in LOOPS:
                        seconds, trajectory_gaps, _ = _one_trajectory(make, tokenizer, name, turns, side, loop)
                        elapsed[name].append(seconds)
                        gaps[name].append(trajectory_gaps)
                for name in LOOPS:
                    figures.append(figure(f"loop/{side}px/{turns}turns/{name}_ms", [t * 1e3 for t in elapsed[name]]))
                ratios = [ours / theirs for ours, theirs in zip(elapsed["mm_tool"], elapsed["tool_agent"])]
                figures.append(figure(f"loop/{side}px/{turns}turns/ratio", ratios, "<= 1.05"))
                if turns == 16:
                    figures += _growth(side, gaps)
    return figures


@contextlib.contextmanager
def _one_torch_thread():
    """torch's other threads spin while they wait, and under load that spinning is counted as CPU time: with one
    thread a trajectory's CPU time is its work (the image processor is the only torch user here)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _growth(side: int, gaps: dict[str, list[list[float]]]) -> list[Figure]:
    figures = []
    for name, runs in gaps.items():
        early = [statistics.mean(run[EARLY_TURNS]) for run in runs]
        late = [statistics.mean(run[LATE_TURNS]) for run in runs]
        figures.append(figure(f"loop/{side}px/{name}_turn_ms(turns3-5)", [seconds * 1e3 for seconds in early]))
        target = "<= 1.15" if name == "mm_tool" else None
        figures.append(
            figure(f"loop/{side}px/{name}_turns14-16_over_turns3-5", [b / a for a, b in zip(early, late)], target)
        )
    return figures


def image_ops(repeats: int = 11, processes: int = 3) -> list[Figure]:
    """Figure 3, from ``processes`` fresh processes (``bench_ops``) of ``ceil(repeats / processes)`` samples each.
    Targets on the ops themselves (512x512, no output cap); the default cap (1280*28*28 px, below 1024x1024) on
    1024x1024 adds a downscale, reported over a 1024x1024 transpose without a target. Ratios pair samples taken in
    the same process: absolute times follow the host (two idle runs differed by 5-10 % on every one), ratios cancel
    it."""
    from verl_mm_tools.bench_ops import BASELINE

    seconds, ratios = {}, {}
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
    command = [sys.executable, "-m", "verl_mm_tools.bench_ops", str(repeats)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"the image-op timing process failed (exit {done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}"
        )
    return json.loads(done.stdout)


def trajectory_memory(model_dir: str, images: int = 16, side: int = 448) -> list[Figure]:
    """What one finished 16-image mm_tool trajectory holds, counted by ``held_bytes``, over its images' raw bytes."""
    from verl.utils.ray_utils import get_event_loop

    with tempfile.TemporaryDirectory() as workdir:
        make, tokenizer = _loop_factory(model_dir, Path(workdir), side, images)
        _, _, (output,) = _one_trajectory(make, tokenizer, "mm_tool", images, side, get_event_loop())
    held, raw = held_bytes(output), images * side * side * 3
    return [
        figure(f"memory/{images}_images_held_MB", [held / 2**20]),
        figure("memory/held_over_raw_image_bytes", [held / raw], "<= 2"),
    ]


def held_bytes(root: object) -> int:
    """The bytes ``root`` holds, counted rather than measured (the same on every run): each object by
    ``sys.getsizeof`` plus the buffer it keeps outside Python (``_buffer_bytes``); containers and plain objects
    (dataclasses, pydantic models) are followed, each object counted once; classes, modules and functions are not."""
    counted, total, pending = set(), 0, [root]
    while pending:
        item = pending.pop()
        if id(item) in counted or isinstance(item, (type, ModuleType, FunctionType)):
            continue
        counted.add(id(item))
        total += sys.getsizeof(item) + _buffer_bytes(item, counted)
        pending.extend(_held_objects(item))
    return total


def _pixel_bytes(mode: str) -> int:
    """Bytes per pixel as Pillow stores them: 1 for 1-bit, grey and palette images, 2 for 16-bit ones, else 4 (RGB
    included: Pillow pads it to 32 bits)."""
    return 1 if mode in ("1", "L", "P") else 2 if mode.startswith("I;16") else 4


def _buffer_bytes(item: object, counted: set) -> int:
    """What ``sys.getsizeof`` does not see: an image's pixels, a tensor's storage (once: views share it). A numpy
    array's own data it does see."""
    if isinstance(item, Image.Image):
        return item.width * item.height * _pixel_bytes(item.mode)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(item, torch.Tensor):
        storage = item.untyped_storage()
        if ("storage", storage.data_ptr()) in counted:
            return 0
        counted.add(("storage", storage.data_ptr()))
        return storage.nbytes()
    return 0


def _held_objects(item: object) -> list:
    if isinstance(item, dict):
        return [*item.keys(), *item.values()]
    if isinstance(item, (list, tuple, set, frozenset)):
        return list(item)
    if isinstance(item, (str, bytes, int, float, complex, bool, Image.Image)) or not hasattr(item, "__dict__"):
        return []
    return list(vars(item).values())


STEP_WARMUP = 2  # the first steps pay one-time costs (compilation of kernels, caches, Ray actor start-up)


def export_cost(model_dir: str, repeats: int = 12, side: int = 448) -> list[Figure]:
    """Figure 6: per_turn against per_trajectory, interleaved pairs of mm_tool trajectories."""
    from verl.utils.ray_utils import get_event_loop

    figures, loop = [], get_event_loop()
    with tempfile.TemporaryDirectory() as workdir, _one_torch_thread():
        factories = {
            export: _loop_factory(model_dir, Path(workdir) / export, side, 8, export)
            for export in ("per_trajectory", "per_turn")
        }
        for turns in (4, 8):
            seconds, samples = {export: [] for export in factories}, {}
            for repeat in range(repeats + 1):  # the first pair warms up (first-call costs are not per-trajectory)
                for export, (make, tokenizer) in factories.items():
                    elapsed, _, samples[export] = _one_trajectory(make, tokenizer, "mm_tool", turns, side, loop)
                    if repeat:
                        seconds[export].append(elapsed)
            for export, outputs in samples.items():
                figures.append(figure(f"export/{turns}turns/{export}/loop_ms", [t * 1e3 for t in seconds[export]]))
                processed = sum(len(output.prompt_ids) + len(output.response_ids) for output in outputs)
                figures.append(figure(f"export/{turns}turns/{export}/tokens_per_trajectory", [processed]))
                figures.append(
                    figure(
                        f"export/{turns}turns/{export}/trained_tokens_per_trajectory",
                        [sum(sum(output.response_mask) for output in outputs)],
                    )
                )
            ratios = [a / b for a, b in zip(seconds["per_turn"], seconds["per_trajectory"])]
            figures.append(figure(f"export/{turns}turns/per_turn_over_per_trajectory_loop_cpu", ratios))
    return figures


# Figure 5's trainer runs: name -> (agent loop, trainer, export, rollout engine)
STEP_RUNS = {
    "tool_agent": ("tool_agent", "sync", "per_trajectory", "hf"),
    "mm_tool": ("mm_tool", "sync", "per_trajectory", "hf"),
    "mm_tool_classic": ("mm_tool", "classic", "per_trajectory", "hf"),
    "mm_tool_per_turn": ("mm_tool", "sync", "per_turn", "hf"),
}
VLLM_STEP_RUN = {"mm_tool_vllm": ("mm_tool", "sync", "per_trajectory", "vllm")}  # with ``--rollout vllm``


def cpu_step(out_dir: Path, steps: int = 12, vllm: bool = False, say=lambda line: None) -> list[Figure]:
    """Figure 5: one short trainer run each (a subprocess each; they cannot share one process)."""
    from verl_mm_tools.demo.run import DemoOptions, run_demo_result

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
        result, _ = run_demo_result(options, say)
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
    (same trainer) and v1 / classic (same loop), and for the classic run the share of each step spent in the rollout
    phase (verl's ``timing_s/gen``) outside its slowest trajectory's generation: verl's postprocess, the streamed
    reward, Ray hops and the agent loop's own work. With the vLLM run: its step time over the hf server's (same loop
    and trainer) and the prefix-cache hit rate of its later turns (``mm_tool/prefix_cache_hit_rate``)."""
    figures, medians = [], {}
    for name in metrics:
        steps = _after_warmup(name, metrics[name])
        medians[name] = statistics.median(step["timing_s/step"] for step in steps)
        figures.append(figure(f"step/{name}_s", [step["timing_s/step"] for step in steps]))
        if STEP_RUNS.get(name, ("", ""))[1] == "classic":
            slowest = "timing_s/agent_loop/generate_sequences/max"
            shares = [(step["timing_s/gen"] - step[slowest]) / step["timing_s/step"] for step in steps]
            figures.append(figure(f"step/{name}/rollout_outside_generation_share", shares, "<= 0.1"))
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
    """``bench_engine``'s turns, measured in a fresh process."""
    command = [sys.executable, "-m", "verl_mm_tools.bench_engine", model_dir]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"the vLLM engine measurement failed (exit {done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])  # vLLM logs to stdout too: the turns are the last line


@contextlib.contextmanager
def pillow_reusing_image_memory(blocks: int = 64):
    """Let Pillow keep freed image blocks for reuse (the loop figures). By default it returns them, and whether an
    image then lands in fresh pages (page faults: ~0.2 ms for a 1024x1024 image) depended on the process's allocation
    history: two runs' timings differed by up to 16 %, with it by up to 5 %."""
    previous = Image.core.get_blocks_max()
    Image.core.set_blocks_max(blocks)
    try:
        yield
    finally:
        Image.core.set_blocks_max(previous)


def run(
    model_dir: str,
    quick: bool = False,
    step_dir: Path | None = None,
    remote: bool = False,
    vllm: bool = False,
    say=lambda line: None,
) -> list[Figure]:
    """Figures 1-4 and 6; figure 5 too when ``step_dir`` is given (the trainer runs write there), figure 7 with
    ``remote`` (``bench_remote``: a local Ray cluster), figure 8 and figure 5's vLLM run with ``vllm``."""
    figures = image_ops(repeats=11 if quick else 31)
    with pillow_reusing_image_memory():
        figures += loop_overhead(model_dir, repeats=12 if quick else 24, pairs_per_size=96 if quick else 192)
    figures += trajectory_memory(model_dir)
    figures += export_cost(model_dir, repeats=6 if quick else 12)
    if step_dir is not None:
        figures += cpu_step(step_dir, steps=6 if quick else 12, vllm=vllm, say=say)
    if remote:
        from verl_mm_tools.bench_remote import remote_figures

        figures += remote_figures(model_dir, quick=quick)
    if vllm:
        figures += engine_figures(model_dir)
    return figures
