"""The video task's demonstrations (format task ``video_read``): token-exact trajectories of the mm_tool loop on the
task's own clips. The scripted model calls ``get_frames`` over the flash in half its first turns (at random) and
answers at once in the other half, alternating red and blue; after a call it answers the colour of the frames the
tool returned. At turn 0 the script sees no more than the model (the prompt's frames miss every flash), so its
direct answers tell nothing about the clips."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image, ImageStat

from verl_mm_tools.demo.format_tasks import FormatTask

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from verl.protocol import DataProto

# The demonstrations' clips come from their own seed stream (as the pictures of the other tasks)
CLIP_SEED_OFFSET = 7_000_001


def video_rollout(
    model_dir: Path, tools_yaml: Path, task: FormatTask, count: int, seed: int
) -> tuple[DataProto, PreTrainedTokenizerBase]:
    """``count`` scripted trajectories on clips of alternating colours, with the flash where the demo task's data has
    it (``demonstrations.labelled_rows`` makes them examples); and the tokenizer."""
    from verl_mm_tools.data.video import DEMO_FLASH_FRAME, FPS, PROMPT_FPS, flash_clip
    from verl_mm_tools.runtime.config import CLASSIC_HOOK
    from verl_mm_tools.runtime.rollout import LocalRollout
    from verl_mm_tools.video import write_video

    rng = random.Random(seed + CLIP_SEED_OFFSET)
    with tempfile.TemporaryDirectory() as folder:
        prompts = []
        for index in range(count):
            clip = flash_clip(rng, task.answers[index % len(task.answers)], first_flash_frame=DEMO_FLASH_FRAME)
            path = write_video(Path(folder) / f"demo_{index:04d}.mp4", clip.frames, FPS)
            entry = {"type": "video", "video": str(path), "fps": PROMPT_FPS}
            prompts.append([{"role": "user", "content": [entry, {"type": "text", "text": task.question}]}])
        output, _, worker = LocalRollout(model_dir, tools_yaml, folder).run(
            VideoScript(task, count, random.Random(seed)),
            prompts,
            max_turns=2,
            extra=CLASSIC_HOOK,
            loop_options={"file_roots": [folder]},
        )
    return output, worker.tokenizer


class VideoScript:
    """The scripted model: at turn 0 a call (half of the ``count`` trajectories, drawn) or an answer (alternating);
    after a call, the colour of the last frame the tool returned."""

    def __init__(self, task: FormatTask, count: int, rng: random.Random) -> None:
        self.task = task
        self.calls = [index < round(count * (1 - task.direct_share)) for index in range(count)]
        rng.shuffle(self.calls)
        self.direct_answers = 0

    def __call__(self, turn: int, prompt_ids: list[int], images: list[Image.Image]) -> str:
        from verl_mm_tools.runtime.scripted_client import tool_call_text

        if turn == 0 and self.calls.pop():
            name, arguments = self.task.calls[0]
            return tool_call_text(name, **arguments)
        if turn == 0:
            self.direct_answers += 1
            answer = self.task.answers[self.direct_answers % len(self.task.answers)]
        else:
            answer = colour_of(images[-1])
        return f"<answer>{answer}</answer><|im_end|>"


def colour_of(frame: Image.Image) -> str:
    """ "red" or "blue": the frame's stronger channel of the two."""
    red, _, blue = ImageStat.Stat(frame.convert("RGB")).mean
    return "red" if red > blue else "blue"
