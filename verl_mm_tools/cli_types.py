"""argparse value types shared by the CLI's commands: a bad value is a usage error naming the valid range."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number in [minimum, maximum] (no maximum: >= minimum)."""
    expected = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number {expected}, got {text!r}") from None
        if value < minimum or maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be a whole number {expected}, got {value}")
        return value

    return parse


def whole_number_list(minimum: int) -> Callable[[str], list[int]]:
    """An argparse ``type``: comma-separated whole numbers, each >= minimum (e.g. ``0,1,2``)."""
    parse_one = whole_number(minimum)

    def parse(text: str) -> list[int]:
        try:
            return [parse_one(item) for item in text.split(",")]
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated whole numbers such as 0,1,2, got {text!r} (each >= {minimum})"
            ) from None

    return parse
