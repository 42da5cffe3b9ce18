"""The model families mm_tool supports, one record each (``catalog.py``): the tiny stand-ins, the image budget's
geometry, the recipes and the docs tables read them."""

from __future__ import annotations

from verl_mm_tools.families.catalog import FAMILIES
from verl_mm_tools.families.record import Family, ImageEntry, ModelSizes, TinyEntry, Vocabulary


def family_of_image_processor(image_processor: object) -> Family | None:
    """The first family whose image processor classes this processor is one of (by class name); None for a
    processor no family declares."""
    name = type(image_processor).__name__
    return next((family for family in FAMILIES.values() if name.startswith(family.image.processor_prefixes)), None)


__all__ = [
    "FAMILIES",
    "Family",
    "ImageEntry",
    "ModelSizes",
    "TinyEntry",
    "Vocabulary",
    "family_of_image_processor",
]
