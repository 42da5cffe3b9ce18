"""A small but real dump: mm_tool trajectories of the embedded tiny VLM through verl's AgentLoopWorker, scored by
verl's reward worker and published by ``MMToolAgentLoopManager``, all in-process (no Ray, no GPU). The model's turns
are scripted, so the dump is reproducible; used by the tests and to render the viewer's screenshot.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from PIL import Image

from verl_mm_tools.runtime.batch import image_prompt
from verl_mm_tools.runtime.rollout import LocalRollout, run_steps
from verl_mm_tools.runtime.scripted_client import Script, tool_call_text
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from verl.protocol import DataProto

ANSWER_90 = "<answer>90</answer><|im_end|>"
# What the scripted model does, by a word of the question: rotate twice (2 tool images) then answer; answer at once
# (wrongly); call an unknown tool then answer; generate an image placeholder (the loop masks the trajectory).
SAMPLE_SCRIPTS = {
    "rotated": [tool_call_text("rotate", degrees=90), tool_call_text("rotate", degrees=90, image_id=1), ANSWER_90],
    "guess": ["<answer>45</answer><|im_end|>"],
    "typo": [tool_call_text("rotat", degrees=90), ANSWER_90],
    "broken": ["<|image_pad|><|im_end|>"],
}


def sample_image(size: tuple[int, int] = (84, 56)) -> Image.Image:
    """A grey image with a red corner, rotated by 90 degrees (the ground truth of the sample rows)."""
    image = Image.new("RGB", size, (128, 128, 128))
    image.paste((255, 0, 0), (0, 0, 28, 28))
    return image.rotate(90, expand=True)


def sample_rows(words: Sequence[str]) -> tuple[list[list[dict]], dict[str, list]]:
    """Rotation prompts (one image each) and their dataset columns; the word picks the script."""
    prompts = [image_prompt(f"{word}: by how many degrees was this image rotated?", [sample_image()]) for word in words]
    columns: dict[str, list] = {
        "data_source": ["verl_mm_tools/rotation"] * len(words),
        "reward_model": [{"style": "rule", "ground_truth": "90"}] * len(words),
        "extra_info": [{"index": index} for index in range(len(words))],
        "index": list(range(len(words))),
    }
    return prompts, columns


def scripted_by_word(tokenizer: PreTrainedTokenizerBase, scripts: dict[str, list[str]] = SAMPLE_SCRIPTS) -> Script:
    """A scripted client's script answering turn k with ``scripts[word][k]``, the word being the question's first."""

    def script(turn: int, prompt_ids: list[int], images: list[Image.Image]) -> str:
        text = cast(str, tokenizer.decode(prompt_ids))  # one sequence of ids decodes to one text
        question = text.split("<|im_start|>user\n", 1)[1]
        word = next(word for word in scripts if word in question.split(":", 1)[0])
        return scripts[word][turn]

    return script


def write_sample_dump(
    dump_dir: str | os.PathLike,
    workdir: str | os.PathLike,
    *,
    model_dir: str | None = None,
    steps: Sequence[int] = (1, 2),
    **loop_options: object,
) -> list[DataProto]:
    """Dump the four sample scripts for each step into ``dump_dir``; returns the generated outputs."""
    from verl_mm_tools.tiny import tiny_model_path

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    tools_yaml = workdir / "tools.yaml"
    tools_yaml.write_text(ROTATE_TOOLS_YAML)
    rollout = LocalRollout(model_dir or tiny_model_path(), tools_yaml, workdir)
    prompts, columns = sample_rows(list(SAMPLE_SCRIPTS))
    options = {"dump_dir": str(dump_dir), **loop_options}
    outputs, _ = run_steps(rollout, scripted_by_word, prompts, columns, steps=steps, loop_options=options)
    return outputs
