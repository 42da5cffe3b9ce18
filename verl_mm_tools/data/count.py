"""The count task, where code pays: how many red squares are in the picture. A 448x448 picture holds 12-36 red
squares of 6x6 px (solid, no antialiasing) among as many squares of near-reds and other colours, on a grey
background with grey noise; at the size the model sees the picture they blur into each other, and a count by eye is
unreliable. The ``python`` tool counts them exactly, for example
``int((np.asarray(images[1]) == (220, 30, 30)).all(-1).sum()) // 36``: the question gives the exact colour and size.

Counts are spread evenly over 12-36 (rows cycle through them). The validation split holds no picture of the
training split. Answers are scored with ``exact_answer_reward`` (the count as digits).
"""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image, ImageDraw

from verl_mm_tools.data.common import LabelledPicture, alternating_pictures, image_row, write_two_splits

DATA_SOURCE = "verl_mm_tools/count"
SIDE = 448
SQUARE = 6
CELL = 14  # squares sit in a 32x32 grid of 14 px cells, one at most per cell: they never touch
RED = (220, 30, 30)
DISTRACTORS = ((200, 40, 40), (230, 60, 30), (30, 30, 220), (30, 160, 60), (240, 200, 40))
COUNTS = tuple(str(count) for count in range(12, 37))
QUESTION = (
    f"How many red squares of exactly {SQUARE}x{SQUARE} pixels with the colour RGB{RED} are in this picture? Other "
    "squares have similar colours. You may call the python tool: the picture is images[1] (a PIL image), numpy is "
    "available. Answer with the number, as <answer>17</answer>."
)
PROMPT = "<image>" + QUESTION
VAL_SEED_OFFSET = 1_000_003


def count_picture(rng: random.Random, label: str) -> Image.Image:
    """``label`` red squares and as many distractors, each in its own grid cell, over grey noise."""
    count = int(label)
    image = Image.new("RGB", (SIDE, SIDE), (128, 128, 128))
    draw = ImageDraw.Draw(image)
    for _ in range(400):  # grey specks (1 px, never red)
        x, y = rng.randrange(SIDE), rng.randrange(SIDE)
        draw.point((x, y), fill=(rng.randrange(90, 170),) * 3)
    cells = rng.sample(range((SIDE // CELL) ** 2), 2 * count)
    for index, cell in enumerate(cells):
        left, top = (cell % (SIDE // CELL)) * CELL + 4, (cell // (SIDE // CELL)) * CELL + 4
        colour = RED if index < count else rng.choice(DISTRACTORS)
        draw.rectangle((left, top, left + SQUARE - 1, top + SQUARE - 1), fill=colour)
    return image


def count_samples(count: int, seed: int, *, exclude: frozenset[str] = frozenset()) -> list[LabelledPicture]:
    """``count`` distinct pictures, none in ``exclude``, their answers cycling through ``COUNTS``."""
    return alternating_pictures(count, seed, list(COUNTS), count_picture, exclude=exclude)


def _row(picture: LabelledPicture, split: str, index: int, agent_name: str) -> dict:
    extra_info = {"split": split, "index": index, "count": int(picture.label), "image_sha256": picture.digest}
    return image_row(DATA_SOURCE, PROMPT, picture.image, picture.label, extra_info, agent_name)


def write_count_dataset(
    out_dir: str | Path, *, train_size: int = 512, val_size: int = 64, seed: int = 0, agent_name: str = "mm_tool"
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` under ``out_dir``; returns their paths."""
    return write_two_splits(
        out_dir,
        "count",
        count_samples,
        lambda picture, split, index: _row(picture, split, index, agent_name),
        train_size=train_size,
        val_size=val_size,
        seed=seed,
        val_seed_offset=VAL_SEED_OFFSET,
    )
