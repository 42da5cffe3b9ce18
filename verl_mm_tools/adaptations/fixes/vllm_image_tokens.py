"""GLM-V and Gemma 4 on verl's vLLM rollout, every prompt with an image. verl's vLLM server hands vLLM the prompt's
token ids after ``qwen2_5_vl_dedup_image_tokens``, which collapses each image's placeholder run to the one placeholder
vLLM expands, for Qwen-VL's image processor only. vLLM (0.24) expands the single placeholder of every family and does
not recognise a run already expanded, so a GLM-V or Gemma 4 prompt reaches the model with each image expanded twice:
vLLM generates from a prompt the trainer never sees, on GPUs too. Fixed: for every other image processor the server
sends the prompt as the chat template wrote it (``unexpanded_image_tokens``); Qwen-VL's stays verl's. Videos of those
families are not handled (mm_tool's tools return images)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    from transformers import ProcessorMixin

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
    "Gemma's processor put around it); Qwen-VL's stays verl's",
    why="verl collapses the runs for Qwen-VL only; vLLM 0.24 expands every family's single placeholder and not a run "
    "already expanded, so GLM-V's and Gemma 4's prompts reach vLLM with each image expanded twice (GLM-4.1V's "
    "engine-check prompt: 161 tokens become 251; Gemma 4's: 348 become 600), on GPUs too. Videos of those families "
    "are not handled",
    applies_to=VERL,
    proof="`tests/adaptations/test_verl_fixes_on_cpu.py::test_verls_vllm_server_sends_glm_and_gemma_prompts_expanded`; "
    "in vLLM: `tests/tiny/test_vllm_engine_on_cpu.py` (`vllm_prompt_tokens_from_verls_own_ids`)",
)


# installed where verl's vLLM server (`vllm_async_server`) binds it by name, too
@ADAPTATION.replaces(TARGET)
def qwen2_5_vl_dedup_image_tokens(
    dedup: Callable[..., list[int]], prompt_ids: list[int], processor: ProcessorMixin
) -> list[int]:
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None or "Qwen2VLImageProcessor" in type(image_processor).__name__:
        return dedup(prompt_ids, processor)
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
