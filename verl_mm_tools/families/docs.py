"""The tables of docs/model_families.md, generated from the family records. ``python -m verl_mm_tools.families.docs
--write`` rewrites them; without ``--write`` it exits 1 where the page differs from the records
(tests/families/test_families_on_cpu.py runs that check)."""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Callable
from pathlib import Path

from verl_mm_tools.families.catalog import FAMILIES
from verl_mm_tools.families.record import Family

logger = logging.getLogger(__name__)

DOC = Path(__file__).resolve().parents[2] / "docs" / "model_families.md"
REGENERATE = "python -m verl_mm_tools.families.docs --write"
BEGIN = "<!-- generated from verl_mm_tools/families: {name} ({command}) -->"
END = "<!-- end of generated table: {name} -->"


def _stand_in_cells(family: Family) -> tuple[str, ...]:
    builder = f"`{family.verl_builder}`" + (f" ({family.verl_builder_note})" if family.verl_builder_note else "")
    return builder, family.tool_parser, family.stand_in_doc


def _image_cells(family: Family) -> tuple[str, ...]:
    image = family.image
    return image.pixels_per_token_doc, image.tokens_448, image.tokens_1000x700, image.bounds_doc


def _table(header: tuple[str, ...], cells: Callable[[Family], tuple[str, ...]]) -> str:
    """One row per run of consecutive families with equal cells, the model types listed in the first column."""
    rows: list[tuple[list[str], tuple[str, ...]]] = []
    for family in FAMILIES.values():
        row = cells(family)
        if rows and rows[-1][1] == row:
            rows[-1][0].append(family.model_type)
        else:
            rows.append(([family.model_type], row))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model_types, row in rows:
        lines.append("| " + " | ".join((", ".join(f"`{name}`" for name in model_types), *row)) + " |")
    return "\n".join(lines)


TABLES: dict[str, Callable[[], str]] = {
    "stand-ins": lambda: _table(
        ("model type", "verl builder (auto)", "tool parser", "stand-in specifics"), _stand_in_cells
    ),
    "tokens per image": lambda: _table(
        (
            "model type",
            "pixels per token",
            "448 x 448 px",
            "1000 x 700 px",
            "pixel bounds (`data.mm_processor_kwargs`)",
        ),
        _image_cells,
    ),
}


def render(text: str) -> str:
    """The page with every generated table replaced by the records' version. ValueError where a table's markers
    are missing."""
    for name, table in TABLES.items():
        begin, end = BEGIN.format(name=name, command=REGENERATE), END.format(name=name)
        match = re.search(re.escape(begin) + r"\n.*?" + re.escape(end), text, re.DOTALL)
        if match is None:
            raise ValueError(
                f"docs/model_families.md has no generated table {name!r}: put the lines {begin!r} and {end!r} "
                f"where it goes, then run {REGENERATE}"
            )
        text = f"{text[: match.start()]}{begin}\n{table()}\n{end}{text[match.end() :]}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the tables in docs/model_families.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    current = DOC.read_text()
    expected = render(current)
    if current == expected:
        logger.info("%s: the tables match the family records", DOC)
        return 0
    if args.write:
        DOC.write_text(expected)
        logger.info("%s: tables rewritten from the family records", DOC)
        return 0
    logger.error("%s differs from the family records; run %s", DOC, REGENERATE)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
