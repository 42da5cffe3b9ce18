"""A video task where looking closer in time pays: a short clip in which a colour flashes for a few frames.

Each clip (H.264 in MP4, written with PyAV) shows a grey field with a white dot moving across it; for ``FLASH_FRAMES``
frames the whole picture turns red or blue. The prompt's video is sampled at ``PROMPT_FPS`` (qwen-vl-utils' sampling:
4 frames of a 4 s clip), and the flash is placed between those frames, so the prompt alone shows no colour and an
answer from it is at chance (0.5). The prompt says about when it flashes; ``get_frames`` over that moment shows it.

Rows hold the clip's path relative to the dataset folder (``videos/train_0001.mp4``): set the mm_tool loop's
``file_roots`` to that folder. Answers are scored with ``exact_answer_reward``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verl_mm_tools.data.common import write_parquet
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.video import write_video

DATA_SOURCE = "verl_mm_tools/video_flash"
COLORS = {"red": (220, 30, 30), "blue": (30, 60, 220)}
FPS = 10
FLASH_FRAMES = 2  # 0.2 s
PROMPT_FPS = 1.0
# The demo's task (``demo --task video``): every flash at 2.0-2.1 s, and the call that shows it, as the zoom task's box
DEMO_FLASH_FRAME = 20
DEMO_CALL = {"video_id": 1, "start_s": 2.0, "end_s": 2.1, "n": 2}
PROMPT = (
    "<video>For a moment, at about {at:.1f} s, the whole picture of this video turns one colour. Which colour: red or "
    "blue? The video above shows only a few of its frames; get_frames shows the frames of any moment. Answer as "
    "<answer>red</answer>."
)


@dataclass(frozen=True)
class FlashClip:
    frames: list[np.ndarray]
    color: str
    first_flash_frame: int

    @property
    def flash_s(self) -> float:
        return self.first_flash_frame / FPS


def prompt_frame_indices(total_frames: int) -> list[int]:
    """The frames qwen-vl-utils samples for the prompt (``fps: PROMPT_FPS``), as its reader computes them."""
    import torch
    from qwen_vl_utils.vision_process import smart_nframes

    count = smart_nframes({"fps": PROMPT_FPS}, total_frames=total_frames, video_fps=FPS)
    return torch.linspace(0, total_frames - 1, count).round().long().tolist()


def flash_starts(total_frames: int) -> list[int]:
    """The frames a flash may start at: it and a frame's margin on either side miss every frame the prompt samples."""
    sampled = set(prompt_frame_indices(total_frames))
    return [
        start
        for start in range(1, total_frames - FLASH_FRAMES)
        if not sampled & set(range(start - 1, start + FLASH_FRAMES + 1))
    ]


def flash_clip(
    rng: random.Random, color: str, *, seconds: int = 4, side: int = 112, first_flash_frame: int | None = None
) -> FlashClip:
    """A clip of ``seconds`` at FPS whose flash misses every frame the prompt samples: at ``first_flash_frame``, or
    drawn."""
    total = seconds * FPS
    starts = flash_starts(total)
    if first_flash_frame is not None and first_flash_frame not in starts:
        raise ConfigError(
            f"a flash at frame {first_flash_frame} of a {seconds} s clip would show in a frame the prompt samples "
            f"({prompt_frame_indices(total)}, a frame's margin on either side); choose one of {starts}"
        )
    first = rng.choice(starts) if first_flash_frame is None else first_flash_frame
    background = rng.randrange(100, 160)
    y = rng.randrange(side // 4, 3 * side // 4)
    frames = []
    for index in range(total):
        frame = np.full((side, side, 3), background, np.uint8)
        if first <= index < first + FLASH_FRAMES:
            frame[:] = COLORS[color]
        x = (index * side) // total
        frame[y - 4 : y + 4, max(0, x - 4) : x + 4] = 255
        frames.append(frame)
    return FlashClip(frames, color, first)


def _rows(clips: list[FlashClip], paths: list[str], split: str, agent_name: str) -> Iterator[dict]:
    for index, (clip, path) in enumerate(zip(clips, paths, strict=True)):
        yield {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": PROMPT.format(at=clip.flash_s)}],
            "videos": [{"video": path, "fps": PROMPT_FPS}],
            "ability": "vision",
            "reward_model": {"style": "rule", "ground_truth": clip.color},
            "extra_info": {
                "split": split,
                "index": index,
                "flash_s": clip.flash_s,
                "flash_frames": [clip.first_flash_frame, clip.first_flash_frame + FLASH_FRAMES - 1],
                "reward_fn": "exact_answer_reward",
            },
            "agent_name": agent_name,
        }


def write_video_dataset(
    out_dir: str | Path,
    *,
    train_size: int = 64,
    val_size: int = 16,
    seed: int = 0,
    seconds: int = 4,
    agent_name: str = "mm_tool",
    first_flash_frame: int | None = None,
) -> tuple[Path, Path]:
    """Write the clips under ``out_dir/videos`` and ``train.parquet`` / ``val.parquet`` (colours alternating;
    validation from its own seed; every flash at ``first_flash_frame`` where given, else each at a drawn moment)."""
    if train_size < 1 or val_size < 1:
        raise ConfigError(f"video dataset sizes must be >= 1, got train_size={train_size}, val_size={val_size}")
    if not 2 <= seconds <= 60:
        raise ConfigError(f"--seconds must be between 2 and 60, got {seconds}")
    out = Path(out_dir)
    written = []
    for split, size, split_seed in (("train", train_size, seed), ("val", val_size, seed + 1_000_003)):
        rng = random.Random(split_seed)
        clips = [
            flash_clip(rng, sorted(COLORS)[index % 2], seconds=seconds, first_flash_frame=first_flash_frame)
            for index in range(size)
        ]
        paths = [f"videos/{split}_{index:04d}.mp4" for index in range(size)]
        for clip, path in zip(clips, paths, strict=True):
            write_video(out / path, clip.frames, FPS)
        written.append(write_parquet(_rows(clips, paths, split, agent_name), out / f"{split}.parquet"))
    return written[0], written[1]
