"""The per-trajectory image budget: how many images and image tokens a trajectory may hold, how a tool image is
sized (``qwen_vl_utils.smart_resize``, exactly as verl sizes dataset images) so the processor never resizes it again,
and what happens to an image that does not fit (the over-budget policy). The budget returns one verdict per image
(``Admission``); a new policy is a member of ``OverBudget`` plus its branch in ``ImageBudget._over_budget``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from PIL import Image
from qwen_vl_utils import smart_resize

from verl_mm_tools.agent_loop.options import OverBudget
from verl_mm_tools.errors import ConfigError, ImageBudgetError
from verl_mm_tools.families import family_of_image_processor
from verl_mm_tools.files import MAX_DECODE_PIXELS, to_rgb
from verl_mm_tools.tokens import (
    counts_soft_tokens,
    pixel_bounds,
    processor_size_tokens,
    soft_token_side,
    soft_token_size,
)

if TYPE_CHECKING:
    from transformers import ProcessorMixin

    from verl_mm_tools.agent_loop.config import MMToolLoopConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImageGeometry:
    """How the processor turns an image into placeholder tokens."""

    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    takes_pixel_bounds = True  # mm_tool's min_pixels / max_pixels narrow the processor's
    # the processor, whose own count ``tokens`` returns (each family resizes odd images its own way)
    processor: ProcessorMixin | None = field(default=None, compare=False, repr=False)
    processor_kwargs: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_processor(
        cls, processor: ProcessorMixin, mm_processor_kwargs: Mapping[str, Any] | None = None
    ) -> ImageGeometry | SoftTokenGeometry:
        """The geometry the processor applies with verl's ``mm_processor_kwargs`` (``pixel_bounds``); Gemma 4's
        processor has its own kind (``SoftTokenGeometry``)."""
        image_processor = processor.image_processor
        kwargs = dict(mm_processor_kwargs or {})  # verl passes a DictConfig: its .get of a missing key costs ~0.1 ms
        if counts_soft_tokens(image_processor):
            return SoftTokenGeometry(soft_token_side(image_processor, kwargs), processor, kwargs)
        min_pixels, max_pixels = pixel_bounds(image_processor, kwargs)
        frames = _frames_per_image(image_processor)
        return cls(
            patch_size=int(kwargs.get("patch_size", image_processor.patch_size)),
            merge_size=int(kwargs.get("merge_size", image_processor.merge_size)),
            min_pixels=min_pixels // frames,
            max_pixels=max_pixels // frames,
            processor=processor,
            processor_kwargs=kwargs,
        )

    @property
    def factor(self) -> int:
        """Pixels per side of one placeholder token."""
        return self.patch_size * self.merge_size

    def resized(self, width: int, height: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
        """(width, height) after smart_resize with these bounds; where its rounding misses them (a narrow
        [min_pixels, max_pixels] band, or a side floored to 0 px), the whole-token size within them closest in aspect
        ratio. Raises ValueError for aspect ratios over 200, and when no such size keeps the aspect within 2x."""
        new_height, new_width = smart_resize(height, width, self.factor, min_pixels=min_pixels, max_pixels=max_pixels)
        if min_pixels <= new_width * new_height <= max_pixels and min(new_width, new_height) >= self.factor:
            return new_width, new_height
        return self._fitted(width / height, min_pixels, max_pixels)

    def _fitted(self, aspect: float, min_pixels: int, max_pixels: int) -> tuple[int, int]:
        token_area, best = self.factor**2, None
        for rows in range(1, max_pixels // token_area + 1):
            fewest, most = max(1, -(-min_pixels // (token_area * rows))), max_pixels // (token_area * rows)
            if fewest > most:
                continue
            columns = min(max(round(aspect * rows), fewest), most)
            distortion = abs(math.log(columns / rows / aspect))
            if best is None or distortion < best[0]:
                best = (distortion, columns * self.factor, rows * self.factor)
        if best is None or best[0] > math.log(2):
            raise ValueError(
                f"no size of whole {self.factor} px tokens between {min_pixels} and {max_pixels} px keeps "
                "its aspect ratio within 2x"
            )
        return best[1], best[2]

    def tokens(self, width: int, height: int) -> int:
        """Placeholder tokens the processor produces for an image of this size: its own count where the geometry
        has the processor; else smart_resize's (transformers keeps at least one token per side where qwen_vl_utils
        floors it to zero)."""
        if self.processor is not None:
            return processor_size_tokens(self.processor, width, height, self.processor_kwargs)
        new_height, new_width = smart_resize(
            height, width, self.factor, min_pixels=self.min_pixels, max_pixels=self.max_pixels
        )
        return max(1, new_width // self.factor) * max(1, new_height // self.factor)


@dataclass(frozen=True)
class SoftTokenGeometry:
    """Gemma 4's: its processor scales every image, up or down, to the largest size of whole soft tokens (pooled
    squares of patches) within its ``max_soft_tokens`` at the image's aspect ratio. So pixel bounds do not apply and
    a smaller image costs as many tokens: the budget can refuse an image but never downscale it to fit."""

    side: int  # pixels per side of one soft token
    processor: ProcessorMixin = field(compare=False, repr=False)
    processor_kwargs: dict = field(default_factory=dict, compare=False, repr=False)
    takes_pixel_bounds = False

    @property
    def factor(self) -> int:
        return self.side

    @property
    def min_pixels(self) -> int:
        return self.side**2

    @property
    def max_pixels(self) -> int:
        width, height = soft_token_size(self.processor.image_processor, 1, 1, self.processor_kwargs)
        return self.tokens(width, height) * self.side**2

    def resized(self, width: int, height: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
        """The image's own size, or the processor's size for it where that is smaller (the processor scales it to
        the same size and tokens either way; the bounds cannot change them)."""
        target = soft_token_size(self.processor.image_processor, width, height, self.processor_kwargs)
        return (width, height) if width * height <= target[0] * target[1] else target

    def tokens(self, width: int, height: int) -> int:
        return processor_size_tokens(self.processor, width, height, self.processor_kwargs)


def _frames_per_image(image_processor: Any) -> int:  # an image processor: see ``tokens``
    """How many frames the processor's pixel bounds count an image as: GLM-V's resize (transformers' glm4v
    ``smart_resize``) bounds ``temporal_patch_size`` frames of the image, Qwen-VL's one (the family record's
    ``bounds_count_frames``)."""
    family = family_of_image_processor(image_processor)
    if family is not None and family.image.bounds_count_frames:
        return int(image_processor.temporal_patch_size)
    return 1


class Verdict(str, Enum):
    ADMITTED = "admitted"
    DOWNSCALED = "downscaled"  # admitted at a smaller size (``note`` says which)
    REFUSED = "refused"  # not shown; ``note`` tells the model why
    STOP = "stop"  # not shown, and the trajectory ends


@dataclass(frozen=True)
class Admission:
    """The budget's verdict on one tool image: the image to show (maybe downscaled) and a note for the model."""

    verdict: Verdict
    image: Image.Image | None = None
    tokens: int = 0
    note: str | None = None

    @property
    def admitted(self) -> bool:
        return self.image is not None


def check_pixel_bounds(config: MMToolLoopConfig, geometry: ImageGeometry | SoftTokenGeometry | None) -> None:
    """A ConfigError for mm_tool pixel bounds on a processor that cannot apply them (at loop start, not per
    trajectory)."""
    if geometry is not None and not geometry.takes_pixel_bounds and (config.min_pixels or config.max_pixels):
        raise ConfigError(
            f"mm_tool min_pixels={config.min_pixels} / max_pixels={config.max_pixels}, but this model's processor "
            "scales every image to its soft-token budget (Gemma 4's max_soft_tokens): pixel bounds cannot apply. "
            "Remove them and set that budget with data.mm_processor_kwargs.max_soft_tokens (70, 140, 280, 560 or "
            "1120), or bound a trajectory's image tokens with max_image_tokens."
        )


class ImageBudget:
    """Counts the images and image tokens of one trajectory's context and sizes new tool images to fit. Without
    ``keep_last_images`` the context holds every image; with it, the last K (the first prompt is rendered whole)."""

    def __init__(self, config: MMToolLoopConfig, geometry: ImageGeometry | SoftTokenGeometry):
        self.config = config
        self.geometry = geometry
        # Never leave the processor's own bounds: it would resize the image again and change the token count.
        self.min_pixels = max(config.min_pixels or 0, geometry.min_pixels)
        self.max_pixels = min(config.max_pixels or geometry.max_pixels, geometry.max_pixels)
        self.charged: list[int] = []  # each image's tokens, in the trajectory's order
        self.video_tokens = 0  # the prompt's videos: in context for the whole trajectory
        self.tool_video_tokens: list[int] = []  # each tool video's, in order: in context from its turn on

    @property
    def images(self) -> int:
        """Images in the context."""
        return len(self._in_context(self.charged))

    @property
    def tokens(self) -> int:
        """Image and video tokens in the context."""
        return sum(self._in_context(self.charged)) + self.video_tokens + sum(self.tool_video_tokens)

    def _in_context(self, charged: list[int], room_for: int = 0) -> list[int]:
        """The images of ``charged`` the context keeps beside ``room_for`` newer ones."""
        keep = self.config.keep_last_images
        if keep is None:
            return charged
        return charged[max(0, len(charged) - keep + room_for) :] if keep > room_for else []

    def admit_prompt_images(self, images: list[Image.Image]) -> None:
        """Charge the dataset's images: they are never refused, and a prompt over budget fails the trajectory (an
        ImageBudgetError)."""
        self.charged += [self.geometry.tokens(*image.size) for image in images]
        problem = self._prompt_problem()
        if problem:
            raise ImageBudgetError(f"{problem}; raise the mm_tool budget or shrink the dataset images")

    def admit_prompt_videos(self, tokens: int) -> None:
        """Charge the prompt's videos (their placeholder tokens, once rendered): never refused, and a prompt over
        budget fails the trajectory (an ImageBudgetError)."""
        self.video_tokens = tokens
        problem = self._prompt_problem()
        if problem:
            raise ImageBudgetError(
                f"{problem}; raise max_image_tokens, or sample the videos with fewer frames or pixels (fps, "
                "nframes, max_pixels in the video entries)"
            )

    def _prompt_problem(self) -> str | None:
        images, tokens = len(self.charged), sum(self.charged) + self.video_tokens  # the first prompt is whole
        if images > self.config.max_images:
            return f"the prompt holds {images} images, more than max_images={self.config.max_images}"
        if self.config.max_image_tokens is not None and tokens > self.config.max_image_tokens:
            videos = f" ({self.video_tokens} of them its videos')" if self.video_tokens else ""
            return (
                f"the prompt's images need {tokens} image tokens{videos}, more than max_image_tokens="
                f"{self.config.max_image_tokens}"
            )
        return None

    def truncate(self, images: int, tool_videos: int | None = None) -> None:
        """Forget the images after the trajectory's first ``images`` and the tool videos after its first
        ``tool_videos`` (a dropped turn's)."""
        del self.charged[images:]
        if tool_videos is not None:
            del self.tool_video_tokens[tool_videos:]

    def admit_video(self, tokens: int) -> Admission:
        """The verdict on a tool's video of ``tokens`` placeholder tokens, charged when admitted: never downscaled
        (its frames are the tool's sampling), refused or stopping by the over-budget policy where it does not fit."""
        left = self._tokens_left(room_for=0)  # a video makes no image leave the context
        if tokens > left:
            reason = (
                f"the image token budget is exhausted ({max(left, 0)} image tokens left, the video needs {tokens}); "
                "the video was not shown: ask for fewer frames (a lower fps or a shorter window)"
            )
            if self.config.over_budget is OverBudget.STOP:
                return Admission(Verdict.STOP, note=reason)
            return Admission(Verdict.REFUSED, note=reason)
        self.tool_video_tokens.append(tokens)
        return Admission(Verdict.ADMITTED, tokens=tokens)

    def sized(self, image: Image.Image) -> Image.Image:
        """``image`` (RGB) at the size the processor gives it, so the image a trajectory holds is the image the model
        sees: an environment's reset images, charged with the prompt's. ValueError for an aspect ratio no size of
        whole tokens keeps."""
        return _to_rgb_size(image, *self.geometry.resized(*image.size, self.min_pixels, self.max_pixels))

    def admit(self, image: Image.Image) -> Admission:
        """The verdict on a tool or environment image, charged when admitted. Never partial: the image is either
        whole or absent."""
        if len(self._in_context(self.charged, room_for=1)) >= self.config.max_images:
            limit = self.config.max_images
            return self._over_budget(
                f"the image budget is exhausted (at most {limit} image{'s' * (limit != 1)} per "
                "conversation); no further images can be shown"
            )
        if image.width * image.height > MAX_DECODE_PIXELS:  # judged from the header: a bomb is never decoded
            return Admission(
                Verdict.REFUSED,
                note=f"the tool produced an image of {image.width}x{image.height} px, "
                f"more than the {MAX_DECODE_PIXELS} px any image may have; it was not decoded",
            )
        try:
            width, height = self.geometry.resized(*image.size, self.min_pixels, self.max_pixels)
        except ValueError as error:
            return Admission(
                Verdict.REFUSED,
                note=f"the tool produced an image of {image.size[0]}x{image.size[1]} px that cannot be shown ({error})",
            )
        tokens, left, verdict = self._tokens_of(width, height), self._tokens_left(), Verdict.ADMITTED
        if tokens > left:
            fitted = self._downscaled(image, left)
            if fitted is None:
                return self._over_budget(
                    f"the image token budget is exhausted ({left} image tokens left, the image "
                    f"needs {tokens}); no further images can be shown"
                )
            (width, height), verdict = fitted, Verdict.DOWNSCALED
            tokens = self._tokens_of(width, height)
        try:
            admitted = _to_rgb_size(image, width, height)
        except Exception as error:  # noqa: BLE001 - truncated or corrupt data: PIL raises many kinds
            return Admission(Verdict.REFUSED, note=f"the tool produced an image that cannot be decoded ({error})")
        self.charged.append(tokens)
        note = (
            f"the image was downscaled to {width}x{height} px to fit the image token budget"
            if verdict == Verdict.DOWNSCALED
            else None
        )
        return Admission(verdict, admitted, tokens, note)

    def _over_budget(self, reason: str) -> Admission:
        """The verdict on an image the budget has no room for, by the over-budget policy."""
        if self.config.over_budget is OverBudget.STOP:
            return Admission(Verdict.STOP, note=reason)
        return Admission(Verdict.REFUSED, note=reason)

    def _tokens_of(self, width: int, height: int) -> int:
        if isinstance(self.geometry, SoftTokenGeometry):  # an image it keeps at its own size is scaled up
            return self.geometry.tokens(width, height)
        return (width // self.geometry.factor) * (height // self.geometry.factor)

    def _tokens_left(self, room_for: int = 1) -> int:
        if self.config.max_image_tokens is None:
            return 1 << 62
        in_context = (
            sum(self._in_context(self.charged, room_for=room_for)) + self.video_tokens + sum(self.tool_video_tokens)
        )
        return self.config.max_image_tokens - in_context

    def _downscaled(self, image: Image.Image, tokens_left: int) -> tuple[int, int] | None:
        if self.config.over_budget is not OverBudget.DOWNSCALE or tokens_left < 1:
            return None
        max_pixels = tokens_left * self.geometry.factor**2
        if max_pixels < self.min_pixels:
            return None
        try:
            width, height = self.geometry.resized(*image.size, self.min_pixels, max_pixels)
        except ValueError:  # too elongated for the tokens left
            return None
        return (width, height) if self._tokens_of(width, height) <= tokens_left else None


def _to_rgb_size(image: Image.Image, width: int, height: int) -> Image.Image:
    """RGB at exactly (width, height); the same object when it already is (no needless copies)."""
    image = to_rgb(image)  # alpha over white, 16-bit and float stretched (a plain convert clips them to white)
    if image.size != (width, height):
        image = image.resize((width, height), Image.Resampling.BICUBIC)
    return image
