"""A custom image tool, as README_VLMRL.md shows it: one pure function plus a class of a few lines."""

from PIL import Image, ImageOps

from verl_mm_tools.tools import ImageTool


def grayscale(image: Image.Image) -> Image.Image:  # the pure op
    return ImageOps.grayscale(image).convert("RGB")


def to_grayscale(image_id: int | None = None):  # what the model sees: the schema comes from this
    """Convert an image to grayscale.

    Args:
        image_id: Number of the image to convert (Image 1 is the first image). Default: the latest image.
    """


class GrayscaleTool(ImageTool):
    schema_fn = to_grayscale

    def apply(self, image):
        return grayscale(image), "converted to grayscale"
