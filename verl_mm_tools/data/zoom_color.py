"""The learn_zoom task: a detail the picture hides at the size the model sees it, and ``zoom_in`` reveals.

Each 896x896 picture is a mosaic of 16 px tiles, each a checkerboard of 1 px squares: red and cyan, or blue and
yellow. Both average to the same grey, and a checkerboard alternates along both axes: the processor shows the picture
at 224x224 (the tiny model's largest image), a 4x downscale that averages it away, tile edges included (a pattern
that alternates along one axis only, dots say, leaves a faint ring at each edge whose colour tells the pattern). The
centre 2x2 tiles draw the answer's pattern; the question asks which checkerboard the 16 px square at their centre
holds (its box is in the prompt); a ``zoom_in`` on that box with ``target_side: 224`` shows it 14x larger, each 1 px
square now one 14 px patch of the vision tower in its square's colour. The other tiles draw their pattern at random,
and a few grey discs make the pictures differ at prompt resolution without saying anything about the answer.

Rows alternate between the answers, so every batch of an even size holds each equally often. The validation split
holds no picture of the training split. Answers are scored with ``exact_answer_reward``.
"""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image, ImageDraw

from verl_mm_tools.data.common import LabelledPicture, alternating_pictures, image_row, write_two_splits

DATA_SOURCE = "verl_mm_tools/zoom_color"
SIDE = 896
TILE = 16
ANSWER_TILES = (432, 432, 464, 464)  # the centre 2x2 tiles draw the answer's pattern
# The box the question names and zoom_in is called on: the centre 16 px, at even pixels (the checkerboard's phase).
# zoom_in to 224 px scales it 14x, so each 1 px square becomes one 14 px patch of the vision tower, a patch of one
# colour; a 32 px box (7x) put 2x2 squares in every patch, whose mean is the same grey for both answers, and RL
# never learned to read that (docs/experiments/learn_zoom.md)
BOX = (440, 440, 456, 456)
BOX_ARGUMENTS = dict(zip(("x1", "y1", "x2", "y2"), BOX))  # zoom_in's arguments for it
# the answer's colour (on even x + y) and its partner: each pair sums to (260, 260, 260), mean grey (130, 130, 130)
PATTERNS = {"red": ((220, 40, 40), (40, 220, 220)), "blue": ((40, 40, 220), (220, 220, 40))}
QUESTION = (
    f"The small square at the centre of this picture, box [{BOX[0]}, {BOX[1]}, {BOX[2]}, {BOX[3]}], is a fine "
    "checkerboard of red and cyan or of blue and yellow, too small to see at this size. You may call the zoom_in tool "
    "on that box to look closer. Answer red or blue, as <answer>red</answer>."
)
PROMPT = "<image>" + QUESTION
VAL_SEED_OFFSET = 1_000_003


def checkered_tile(color: str) -> Image.Image:
    square, partner = PATTERNS[color]
    tile = Image.new("RGB", (TILE, TILE), partner)
    for y in range(TILE):
        for x in range(y % 2, TILE, 2):
            tile.putpixel((x, y), square)
    return tile


def zoom_color_picture(rng: random.Random, color: str) -> Image.Image:
    """The mosaic with ``color``'s checkerboard in ``BOX`` and random tiles elsewhere, with grey discs off the box."""
    tiles = {name: checkered_tile(name) for name in PATTERNS}
    image = Image.new("RGB", (SIDE, SIDE))
    for top in range(0, SIDE, TILE):
        for left in range(0, SIDE, TILE):
            inside = ANSWER_TILES[0] <= left < ANSWER_TILES[2] and ANSWER_TILES[1] <= top < ANSWER_TILES[3]
            image.paste(tiles[color if inside else rng.choice(sorted(PATTERNS))], (left, top))
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randrange(2, 6)):
        radius = rng.randrange(24, 80)
        x, y = rng.randrange(radius, SIDE - radius), rng.randrange(radius, SIDE - radius)
        if abs(x - SIDE / 2) < radius + 80 and abs(y - SIDE / 2) < radius + 80:
            continue  # keep the discs (and their blur at prompt resolution) off the box
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=(rng.randrange(60, 200),) * 3)
    return image


def zoom_color_samples(count: int, seed: int, *, exclude: frozenset[str] = frozenset()) -> list[LabelledPicture]:
    """``count`` distinct pictures, none in ``exclude``, answers alternating in the order of ``PATTERNS``."""
    return alternating_pictures(count, seed, list(PATTERNS), zoom_color_picture, exclude=exclude)


def _row(picture: LabelledPicture, split: str, index: int, agent_name: str) -> dict:
    extra_info = {
        "split": split,
        "index": index,
        "color": picture.label,
        "target_box": list(BOX),
        "image_sha256": picture.digest,
    }
    return image_row(DATA_SOURCE, PROMPT, picture.image, picture.label, extra_info, agent_name)


def write_zoom_color_dataset(
    out_dir: str | Path, *, train_size: int = 64, val_size: int = 16, seed: int = 0, agent_name: str = "mm_tool"
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` under ``out_dir``; returns their paths."""
    return write_two_splits(
        out_dir,
        "zoom_color",
        zoom_color_samples,
        lambda picture, split, index: _row(picture, split, index, agent_name),
        train_size=train_size,
        val_size=val_size,
        seed=seed,
        val_seed_offset=VAL_SEED_OFFSET,
    )
