"""The families' own tokens (what the tiny builder's tokenizers and configs hold), in each family's order."""

from __future__ import annotations

from dataclasses import replace

from verl_mm_tools.families.record import Vocabulary

QWEN_VOCABULARY = Vocabulary(
    special=(
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|object_ref_start|>",
        "<|object_ref_end|>",
        "<|box_start|>",
        "<|box_end|>",
        "<|quad_start|>",
        "<|quad_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
        "<|image_pad|>",
        "<|video_pad|>",
    ),
    added=("<tool_call>", "</tool_call>"),
    eos="<|im_end|>",
    pad="<|endoftext|>",
    stop=("<|im_end|>",),
    config_ids=(
        ("image_token_id", "<|image_pad|>"),
        ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"),
        ("vision_end_token_id", "<|vision_end|>"),
    ),
    thinking=("<think>", "</think>"),
)
# Qwen3.5 always has its reasoning delimiters and the tool-response tags as tokens.
QWEN3_5_VOCABULARY = replace(
    QWEN_VOCABULARY,
    added=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"),
    thinking=(),
)
# GLM-4.1V / 4.5V / 4.6V: a turn ends at <|user|> or <|observation|> (the next turn's role), as in GLM's own
# generation_config; <|image|> is the placeholder the processor repeats.
GLM_VOCABULARY = Vocabulary(
    special=(
        "<|endoftext|>",
        "[MASK]",
        "[gMASK]",
        "[sMASK]",
        "<sop>",
        "<eop>",
        "<|system|>",
        "<|user|>",
        "<|assistant|>",
        "<|observation|>",
        "<|begin_of_image|>",
        "<|end_of_image|>",
        "<|begin_of_video|>",
        "<|end_of_video|>",
        "<|image|>",
        "<|video|>",
    ),
    added=(
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
    ),
    eos="<|endoftext|>",
    pad="<|endoftext|>",
    stop=("<|endoftext|>", "<|user|>", "<|observation|>"),
    config_ids=(
        ("image_token_id", "<|image|>"),
        ("video_token_id", "<|video|>"),
        ("image_start_token_id", "<|begin_of_image|>"),
        ("image_end_token_id", "<|end_of_image|>"),
        ("video_start_token_id", "<|begin_of_video|>"),
        ("video_end_token_id", "<|end_of_video|>"),
    ),
)


# Gemma 4: turns are <|turn>role ... <turn|>; tool schemas, calls and results have their own delimiters and strings are
# quoted with <|"|>; an image is <|image> + <|image|> per soft token + <image|>. A call ends with <tool_call|> (verl's
# gemma4 parser adds it to the stop tokens), an answer with <turn|>.
GEMMA4_VOCABULARY = Vocabulary(
    special=(
        "<pad>",
        "<eos>",
        "<bos>",
        "<unk>",
        "<mask>",
        "<|turn>",
        "<turn|>",
        "<|tool>",
        "<tool|>",
        "<|tool_call>",
        "<tool_call|>",
        "<|tool_response>",
        "<tool_response|>",
        '<|"|>',
        "<|think|>",
        "<|channel>",
        "<channel|>",
        "<|image>",
        "<image|>",
        "<|image|>",
        "<|audio>",
        "<audio|>",
        "<|audio|>",
        "<|video|>",
    ),
    added=(),
    eos="<eos>",
    pad="<pad>",
    stop=("<eos>", "<turn|>"),
    config_ids=(
        ("image_token_id", "<|image|>"),
        ("video_token_id", "<|video|>"),
        ("boi_token_id", "<|image>"),
        ("eoi_token_id", "<image|>"),
        ("audio_token_id", "<|audio|>"),
        ("boa_token_id", "<|audio>"),
        ("eoa_token_index", "<audio|>"),
    ),
    bos="<bos>",
    named=(
        ("image_token", "<|image|>"),
        ("boi_token", "<|image>"),
        ("eoi_token", "<image|>"),
        ("audio_token", "<|audio|>"),
        ("boa_token", "<|audio>"),
        ("eoa_token", "<audio|>"),
    ),
)
