"""Every model family, declared once: the tiny builder, the image budget, the recipes' check and the docs tables read
these records. A new family is one record here, its template under ``tiny/templates/``, its recipe under
``examples/recipes/family/`` and its tests (docs/contributing.md)."""

from __future__ import annotations

from dataclasses import replace

from verl_mm_tools.families import towers
from verl_mm_tools.families.record import Family, ImageEntry, TinyEntry
from verl_mm_tools.families.vocabularies import (
    GEMMA4_VOCABULARY,
    GLM_VOCABULARY,
    QWEN3_5_VOCABULARY,
    QWEN_VOCABULARY,
)

QWEN_BOUNDS_DOC = "`min_pixels` with `max_pixels`, or `size`"
QWEN2_IMAGE = ImageEntry(
    patch_size=14,
    processor_prefixes=("Qwen2VLImageProcessor",),
    tokens_448="256",
    tokens_1000x700="900",
    bounds_doc=QWEN_BOUNDS_DOC,
)
QWEN3_IMAGE = replace(QWEN2_IMAGE, patch_size=16, tokens_448="196", tokens_1000x700="682", bounds_doc="as Qwen2.5-VL")
GLM_IMAGE = ImageEntry(
    patch_size=14,
    processor_prefixes=("Glm4v", "Glm46V"),  # GLM-4.6V's own processor classes resize alike
    bounds=("size",),
    bounds_count_frames=True,
    tokens_448="256",
    tokens_1000x700="900",
    bounds_doc="`size` only, counting an image as two frames (`longest_edge` 2 x the pixels)",
)
# Gemma 4: 16 px patches pooled 3x3 into one soft token; the processor scales every image to its soft-token budget
# (max_soft_tokens). The tiny stand-in takes the smallest budget: a square image becomes 8 x 8 soft tokens, as the
# Qwen stand-ins' at most 64 tokens per image.
GEMMA4_IMAGE = ImageEntry(
    patch_size=16,
    processor_prefixes=("Gemma4",),
    bounds=("max_soft_tokens",),
    pooling=3,
    soft_token_budgets=(70, 140, 280, 560, 1120),
    tokens_448="256 (at `max_soft_tokens` 280)",
    tokens_1000x700="280",
    bounds_doc="`max_soft_tokens` (70, 140, 280, 560, 1120) only",
)

QWEN2_VL_TINY = TinyEntry(
    processor_class="Qwen2VLProcessor",
    image_processor_class="Qwen2VLImageProcessor",
    video_processor_class="Qwen2VLVideoProcessor",
    vocabulary=QWEN_VOCABULARY,
    vision_config=towers.qwen2_vl_vision,
)
QWEN3_VL_TINY = TinyEntry(
    processor_class="Qwen3VLProcessor",
    image_processor_class="Qwen2VLImageProcessor",
    video_processor_class="Qwen3VLVideoProcessor",
    vocabulary=QWEN_VOCABULARY,
    vision_config=towers.qwen3_vl_vision,
    interleaved_mrope=True,
)
GLM4V_TINY = TinyEntry(
    processor_class="Glm4vProcessor",
    image_processor_class="Glm4vImageProcessor",
    video_processor_class="Glm4vVideoProcessor",
    vocabulary=GLM_VOCABULARY,
    vision_config=towers.glm4v_vision,
    rotary_share=0.5,
)
QWEN_BUILDER = "QwenVLContinuousTokenBuilder"
GLM_BUILDER = "GLM46VContinuousTokenBuilder"

QWEN2_VL = Family(
    name="qwen2_vl",
    model_type="qwen2_vl",
    template="qwen2_vl.jinja",
    tool_parser="hermes",
    image=QWEN2_IMAGE,
    tiny=QWEN2_VL_TINY,
    checkpoint="Qwen/Qwen2-VL-7B-Instruct",
    verl_builder=QWEN_BUILDER,
    stand_in_doc="see README",
)
# Qwen2.5-VL ships Qwen2-VL's chat template unchanged
QWEN2_5_VL = replace(
    QWEN2_VL,
    name="qwen2_5_vl",
    model_type="qwen2_5_vl",
    tiny=replace(QWEN2_VL_TINY, processor_class="Qwen2_5_VLProcessor", vision_config=towers.qwen2_5_vl_vision),
    checkpoint="Qwen/Qwen2.5-VL-3B-Instruct",
)
QWEN3_VL = replace(
    QWEN2_VL,
    name="qwen3_vl",
    model_type="qwen3_vl",
    template="qwen3_vl.jinja",
    image=QWEN3_IMAGE,
    tiny=QWEN3_VL_TINY,
    checkpoint="Qwen/Qwen3-VL-8B-Instruct",
    thinking_template="qwen3_vl_thinking.jinja",
)
# Qwen3-VL-30B-A3B / 235B-A22B: Qwen3-VL's processor and chat template, experts
QWEN3_VL_MOE = replace(
    QWEN3_VL,
    name="qwen3_vl_moe",
    model_type="qwen3_vl_moe",
    tiny=replace(QWEN3_VL_TINY, text_fields=towers.qwen3_vl_moe_text, experts_in_released_layout=True),
    checkpoint="Qwen/Qwen3-VL-30B-A3B-Instruct",
    stand_in_doc="4 experts, 2 per token; experts saved in the released layout (transformers 5 saves them "
    "transposed, vLLM reads only the released one) and `norm_topk_prob` as Qwen3-VL-30B-A3B's config.json has it",
    thinking_template=None,
)
# natively multimodal: Qwen3-VL's vision tower and processor, a hybrid (linear + full attention) text model
QWEN3_5 = replace(
    QWEN3_VL,
    name="qwen3_5",
    model_type="qwen3_5",
    template="qwen3_5.jinja",
    tool_parser="qwen3_coder",
    tiny=replace(
        QWEN3_VL_TINY,
        vocabulary=QWEN3_5_VOCABULARY,
        vision_config=towers.qwen3_5_vision,
        text_fields=towers.qwen3_5_text,
        rotary_share=0.25,
    ),
    checkpoint="Qwen/Qwen3.5-27B",
    verl_builder_note="verl upgrades its text family `qwen35` with a processor",
    stand_in_doc="one Gated DeltaNet (linear attention) layer then one full attention layer; a quarter of each head "
    "rotated; no deepstack mergers",
    thinking_template=None,
)
GLM4V = Family(
    name="glm4v",
    model_type="glm4v",
    template="glm4v.jinja",
    tool_parser="glm",
    image=GLM_IMAGE,
    tiny=GLM4V_TINY,
    checkpoint="zai-org/GLM-4.1V-9B-Thinking",
    verl_builder=GLM_BUILDER,
    stand_in_doc="GLM's vocabulary; half of each head rotated; stop tokens `<\\|endoftext\\|>`, `<\\|user\\|>`, "
    "`<\\|observation\\|>`",
)
# GLM-4.5V / 4.6V: GLM-4.1V's processor and format, experts
GLM4V_MOE = replace(
    GLM4V,
    name="glm4v_moe",
    model_type="glm4v_moe",
    tiny=replace(GLM4V_TINY, text_fields=towers.glm4v_moe_text),
    checkpoint="zai-org/GLM-4.5V",
    stand_in_doc="as `glm4v`; layer 0 dense, layer 1 routed (4 experts, 2 per token, 1 shared); `use_qk_norm` as "
    "GLM-4.5V's config.json has it",
)
GEMMA4 = Family(
    name="gemma4",
    model_type="gemma4",
    template="gemma4.jinja",
    tool_parser="gemma4",  # verl's parser, with adaptations' fix of its list and object arguments
    image=GEMMA4_IMAGE,
    tiny=TinyEntry(
        processor_class="Gemma4Processor",
        image_processor_class="Gemma4ImageProcessor",
        video_processor_class="Gemma4VideoProcessor",
        vocabulary=GEMMA4_VOCABULARY,
        vision_config=towers.gemma4_vision,
        text_fields=towers.gemma4_text,
        mrope=False,
        tied_embeddings=True,  # as Gemma's released checkpoints; the other stand-ins are untied
    ),
    checkpoint="google/gemma-4-E4B-it",
    verl_builder="Gemma4VLContinuousTokenBuilder",
    stand_in_doc="Gemma 4's vocabulary (`<\\|turn>`, `<\\|tool_call>`, `<\\|\"\\|>`, `<\\|image>`...); one "
    "sliding-window layer then one global layer; tied LM head; no audio tower; the processor's smallest soft-token "
    "budget (70) and `default_output_length` in the vision config as the released config.json has it (vLLM reads it)",
)

FAMILIES: dict[str, Family] = {
    family.name: family for family in (QWEN2_VL, QWEN2_5_VL, QWEN3_VL, QWEN3_VL_MOE, QWEN3_5, GLM4V, GLM4V_MOE, GEMMA4)
}
