"""GLM-V and Gemma 4 on verl's vLLM rollout, every prompt with an image. verl's vLLM server hands vLLM the prompt's
token ids after ``qwen2_5_vl_dedup_image_tokens``, which collapses each image's placeholder run to the one placeholder
vLLM expands, for Qwen-VL's image processor only. vLLM (0.24) expands the single placeholder of every family and does
not recognise a run already expanded, so a GLM-V or Gemma 4 prompt reaches the model with each image expanded twice:
vLLM generates from a prompt the trainer never sees, on GPUs too. Fixed: for every other image processor the server
sends the prompt as the chat template wrote it (``unexpanded_image_tokens``); Qwen-VL's stays verl's. Videos of those
families are not handled (mm_tool's tools return images).

Qwen3-VL's videos (Qwen3-VL, Qwen3.5): its processor writes each video as one ``<t seconds>`` timestamp plus a
``<|vision_start|>`` ... ``<|vision_end|>`` run per frame group, and verl collapses only the runs, so vLLM (which
expands the one ``<|vision_start|><|video_pad|><|vision_end|>`` the template wrote into all of that) received every
timestamp and frame delimiter twice: a 4 s clip's prompt of 212 tokens became 237. Each video's frame groups are
sent as that one placeholder (``collapsed_timestamped_videos``)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    from transformers import ProcessorMixin

logger = logging.getLogger(__name__)
TIMESTAMP = re.compile(r"<\d+(\.\d+)? seconds>")  # Qwen3-VL's processor: f"<{seconds:.1f} seconds>"
LONGEST_TIMESTAMP = 24  # tokens: "<14400.0 seconds>" spelled one character a token

TARGET = Target(
    "verl.workers.rollout.utils",
    "qwen2_5_vl_dedup_image_tokens",
    "feb6190733badcd3b7040c61db5814d55dd87ef0c979a0018a508b423f908892",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="for every image processor but Qwen-VL's, sends vLLM the prompt as the chat template wrote it "
    "(`unexpanded_image_tokens`: each image's placeholder run as one placeholder, without the `<|image>` / `<image|>` "
    "Gemma's processor put around it); Qwen-VL's stays verl's, but Qwen3-VL's videos, written by its processor as "
    "timestamped frame groups, are sent as the one `<|vision_start|><|video_pad|><|vision_end|>` the template wrote "
    "(`collapsed_timestamped_videos`)",
    why="verl collapses the runs for Qwen-VL only; vLLM 0.24 expands every family's single placeholder and not a run "
    "already expanded, so GLM-V's and Gemma 4's prompts reach vLLM with each image expanded twice (GLM-4.1V's "
    "engine-check prompt: 161 tokens become 251; Gemma 4's: 348 become 600), on GPUs too; Qwen3-VL's video prompts "
    "reach vLLM with their timestamps and frame delimiters twice (a 4 s clip's prompt: 212 tokens become 237). "
    "Videos of GLM-V and Gemma 4 are not handled",
    applies_to=VERL,
    proof="`tests/adaptations/test_verl_fixes_on_cpu.py::test_verls_vllm_server_sends_glm_and_gemma_prompts_expanded`, "
    "`::test_verls_vllm_server_sends_qwen3_vl_videos_with_their_timestamps`; "
    "in vLLM: `tests/tiny/test_vllm_engine_on_cpu.py` (`vllm_prompt_tokens_from_verls_own_ids`)",
)


# installed where verl's vLLM server (`vllm_async_server`) binds it by name, too
@ADAPTATION.replaces(TARGET)
def qwen2_5_vl_dedup_image_tokens(
    dedup: Callable[..., list[int]], prompt_ids: list[int], processor: ProcessorMixin
) -> list[int]:
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None or "Qwen2VLImageProcessor" in type(image_processor).__name__:
        ids = dedup(prompt_ids, processor)
        video_processor = type(getattr(processor, "video_processor", None)).__name__
        return collapsed_timestamped_videos(ids, processor) if video_processor.startswith("Qwen3VL") else ids
    return unexpanded_image_tokens(prompt_ids, processor)


# processor: a family's own (GLM-V's, Gemma 4's), whose image_token, boi_token and eoi_token ProcessorMixin lacks
@ADAPTATION.implements
def unexpanded_image_tokens(prompt_ids: Iterable[int], processor: Any) -> list[int]:
    """The prompt as the chat template wrote it, before the processor expanded each image: each run of the image
    placeholder as one token, without the begin- and end-of-image tokens the processor put around the run (Gemma's
    <|image> and <image|>, which vLLM adds again with the run)."""
    tokenizer = processor.tokenizer
    image = tokenizer.convert_tokens_to_ids(processor.image_token)
    added_around = [getattr(processor, name, None) for name in ("boi_token", "eoi_token")]
    begin, end = (tokenizer.convert_tokens_to_ids(token) if token else None for token in added_around)
    ids = list(prompt_ids)
    kept = []
    for index, token in enumerate(ids):
        before = ids[index - 1] if index else None
        after = ids[index + 1] if index + 1 < len(ids) else None
        if token == image and before == image:
            continue
        if (token == begin and after == image) or (token == end and before == image):
            continue
        kept.append(token)
    return kept


# processor: Qwen3-VL's (also Qwen3.5's), whose vision_start/end_token_id ProcessorMixin lacks
@ADAPTATION.implements
def collapsed_timestamped_videos(prompt_ids: list[int], processor: Any) -> list[int]:
    """``prompt_ids`` (each placeholder run collapsed by verl) with each video's frame groups, ``<t seconds>`` +
    ``<|vision_start|><|video_pad|><|vision_end|>`` each, as the one ``<|vision_start|><|video_pad|><|vision_end|>``
    the chat template wrote. A video whose first timestamp cannot be told from the text before it is left as it is
    (logged): vLLM then sees that video twice."""
    group = [processor.vision_start_token_id, processor.video_token_id, processor.vision_end_token_id]
    ids = list(prompt_ids)
    kept: list[int] = []
    index = 0
    while index < len(ids):
        timestamp = _timestamp_before(kept, processor.tokenizer) if ids[index : index + 3] == group else 0
        if not timestamp:
            kept.append(ids[index])
            index += 1
            continue
        del kept[len(kept) - timestamp :]
        index += 3
        while (following := _next_frame_group(ids, index, group, processor.tokenizer)) is not None:
            index = following
        kept += group
    return kept


def _timestamp_before(kept: list[int], tokenizer: Any) -> int:
    """How many of ``kept``'s last tokens spell a ``<t seconds>`` timestamp (0: none; logged)."""
    for length in range(1, min(LONGEST_TIMESTAMP, len(kept)) + 1):
        if TIMESTAMP.fullmatch(tokenizer.decode(kept[-length:])):
            return length
    logger.warning(
        "a Qwen3-VL video frame without its timestamp before it (%r): the video is sent to vLLM as the processor "
        "wrote it, and vLLM expands it again",
        tokenizer.decode(kept[-LONGEST_TIMESTAMP:]),
    )
    return 0


def _next_frame_group(ids: list[int], index: int, group: list[int], tokenizer: Any) -> int | None:
    """Where the frame ``group`` after ``index`` ends, if a timestamp and the group follow at once; else None."""
    for length in range(1, LONGEST_TIMESTAMP + 1):
        at = index + length
        if ids[at : at + 3] == group and TIMESTAMP.fullmatch(tokenizer.decode(ids[index:at])):
            return at + 3
    return None
