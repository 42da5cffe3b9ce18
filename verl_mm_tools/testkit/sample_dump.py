"""A small but real dump: mm_tool trajectories of the embedded tiny VLM through verl's AgentLoopWorker, scored by
verl's reward worker and published by ``MMToolAgentLoopManager``, all in-process (no Ray, no GPU). The model's turns
are scripted, so the dump is reproducible; used by the tests and to render the viewer's screenshot.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from PIL import Image

from verl_mm_tools.runtime.batch import image_prompt, make_batch
from verl_mm_tools.runtime.config import CLASSIC_HOOK
from verl_mm_tools.runtime.workers import generate, in_process_manager, restored_loop_registry
from verl_mm_tools.testkit.rollout import LocalRollout
from verl_mm_tools.testkit.scripted import Script, ScriptedServer, tool_call_text
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from transformers import PreTrainedTokenizerBase
    from verl.protocol import DataProto

    # the ScriptedServer's turns, from the worker's tokenizer
    TurnsFor = Callable[[PreTrainedTokenizerBase], Sequence[str | None] | Script]

REWARD_OVERRIDES = (
    "reward.reward_manager.name=mm_turn_discount",
    "+reward.reward_kwargs.gamma=0.9",
    "+reward.reward_kwargs.reward_fn=rotation_reward_45",
)
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
    """A ScriptedServer script answering turn k with ``scripts[word][k]``, the word being the question's first."""

    def script(turn: int, prompt_ids: list[int], images: list[Image.Image]) -> str:
        text = cast(str, tokenizer.decode(prompt_ids))  # one sequence of ids decodes to one text
        question = text.split("<|im_start|>user\n", 1)[1]
        word = next(word for word in scripts if word in question.split(":", 1)[0])
        return scripts[word][turn]

    return script


def run_steps(
    rollout: LocalRollout,
    turns_for: TurnsFor,
    prompts: Sequence[list[dict]],
    columns: dict,
    *,
    steps: Sequence[int],
    loop_options: dict,
    extra: Sequence[str] = (),
    validate: bool = False,
) -> tuple[list[DataProto], ScriptedServer]:
    """Generate one batch per step through MMToolAgentLoopManager (scored in-process); returns the outputs and the
    server (its ``requests`` hold the images the model saw). ``turns_for(tokenizer)`` gives the ScriptedServer's
    turns (a list of texts or a script function)."""
    config = rollout.config(loop_options=loop_options, extra=[*CLASSIC_HOOK, *REWARD_OVERRIDES, *extra])
    with restored_loop_registry():
        return _run_manager_steps(config, turns_for, prompts, columns, steps, validate)


def _run_manager_steps(
    config: DictConfig,
    turns_for: TurnsFor,
    prompts: Sequence[list[dict]],
    columns: dict,
    steps: Sequence[int],
    validate: bool,
) -> tuple[list[DataProto], ScriptedServer]:
    manager, worker = in_process_manager(config)
    server = ScriptedServer(worker.tokenizer, turns_for(worker.tokenizer))
    worker.llm_client = server
    outputs = []
    for step in steps:
        batch = make_batch(prompts, **columns)
        batch.meta_info.update(global_steps=step, validate=validate)
        outputs.append(generate(manager, batch))
    return outputs, server


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
