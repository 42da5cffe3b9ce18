"""``verl-mm-tools eval`` of video prompts (``make-data video``): the checkpoint engine generates from the inputs the
trainer computes (frames, grid, M-RoPE positions), and an endpoint receives each prompt video as a ``video_url`` of
the loop's frames with their sampling metadata, as vLLM 0.24 reads it."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from chat_servers import PolicyChatServer, answer, api_call
from PIL import Image

from verl_mm_tools.data.video import COLORS, FPS, write_video_dataset
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.evaluate.checkpoint import CheckpointClient
from verl_mm_tools.evaluate.endpoint import EndpointClient, EndpointSettings
from verl_mm_tools.evaluate.run import NO_TOOLS, TOOLS, EvalOptions, evaluate
from verl_mm_tools.tools.tool_yaml import GET_FRAMES_TOOLS_YAML

SOURCE = "verl_mm_tools/video_flash"
ROWS = 2
# 4 s clips at 10 fps, sampled at 1 fps by qwen-vl-utils as verl loads them: frames 0, 13, 26, 39, 112 px scaled up
# to 336 px (its video minimum); the tiny processor resizes them to a grid (2, 16, 16): 2 frames a temporal patch,
# 2 x 2 patches a token
FRAMES, INDICES = 4, [0, 13, 26, 39]
VIDEO_TOKENS = 128
# for an endpoint, sampled at the processor's size (112 px, kept by both): an endpoint's 8-bit frames then give the
# trainer's pixel values
AT_PROCESSOR_SIZE = {"min_pixels": 3136, "max_pixels": 50176}
SIDE = 112


@pytest.fixture(scope="module")
def video_data(tmp_path_factory) -> tuple[Path, Path]:
    """``make-data video``'s validation split (2 rows) and the loop config reading its clips."""
    out = tmp_path_factory.mktemp("video")
    _, val = write_video_dataset(out, train_size=1, val_size=ROWS, seed=1)
    moments = [info["flash_s"] for info in pd.read_parquet(val)["extra_info"]]
    assert len(set(moments)) == ROWS  # a row's prompt names its own moment (``_clip_of``)
    loops = out / "agent_loops.yaml"
    loop = "verl_mm_tools.agent_loop.MMToolAgentLoop"
    loops.write_text(f"- {{name: mm_tool, _target_: {loop}, file_roots: [{json.dumps(str(out))}]}}\n")
    return val, loops


@pytest.fixture(scope="module")
def tools_yaml(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tools") / "tools.yaml"
    path.write_text(GET_FRAMES_TOOLS_YAML)
    return path


def options(data: Path, loops: Path, out: Path, model_dir, tools_yaml: Path | None = None, **changes) -> EvalOptions:
    settings = {
        "data": data,
        "out": out,
        "model_path": str(model_dir),
        "tools_yaml": tools_yaml,
        "loop_config": loops,
        "modes": (TOOLS,) if tools_yaml else (NO_TOOLS,),
        "reward_fn": "exact_answer_reward",
        "max_turns": 2,
        "response_length": 512,
    }
    return EvalOptions(**{**settings, **changes})


def test_the_checkpoint_generates_from_the_trainers_inputs(video_data, tiny_model_dir, tiny_processor, tmp_path):
    """The first turn of each row: the prompt ids are the processor's for the clip as qwen-vl-utils samples it (128
    video tokens), and the checkpoint's log-probs are a float32 forward's at the trainer's position ids; with the
    positions transformers computes without the video's timing they would differ."""
    data, loops = video_data
    calls = []

    def recording_client(tokenizer):
        client = CheckpointClient(tiny_model_dir)
        generate = client.engine.generate

        def recorded(prompt_ids, images, **settings):
            result = generate(prompt_ids, images, **settings)
            calls.append((prompt_ids, settings.get("inputs"), result))
            return result

        client.engine.generate = recorded
        return client

    report = evaluate(options(data, loops, tmp_path, tiny_model_dir, max_turns=1, response_length=8), recording_client)
    assert report["modes"][NO_TOOLS][SOURCE]["rows"] == ROWS
    assert len(calls) == ROWS
    model = calls[0][1] is not None and _model(tiny_model_dir)
    video_pad = tiny_processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    for prompt_ids, inputs, (token_ids, log_probs) in calls:
        expected = _processor_inputs(tiny_processor, prompt_ids, data.parent)
        assert prompt_ids == expected["input_ids"][0].tolist()  # exact ids, placeholders expanded as the processor
        assert prompt_ids.count(video_pad) == VIDEO_TOKENS
        assert expected["video_grid_thw"].tolist() == [[2, 16, 16]]
        assert torch.equal(inputs["pixel_values_videos"], expected["pixel_values_videos"])
        assert torch.equal(inputs["video_grid_thw"], expected["video_grid_thw"])
        positions = _trainer_positions(tiny_processor, prompt_ids + token_ids, expected)
        assert torch.equal(inputs["position_ids"], positions[..., : len(prompt_ids)])
        assert len(token_ids) == 8
        reference, greedy = _log_probs(model, prompt_ids, token_ids, expected, positions)
        assert greedy == token_ids  # eval's tokens are the trainer forward's greedy ones
        assert max(abs(a - b) for a, b in zip(log_probs, reference, strict=True)) < 1e-5  # measured 0 and 4.8e-7
        untimed, _ = _log_probs(model, prompt_ids, token_ids, expected, None)  # the model's positions: 1 s a grid step
        assert max(abs(a - b) for a, b in zip(log_probs, untimed, strict=True)) > 1e-4  # measured 1.0e-3 and 7.5e-4


def _model(model_dir):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def _processor_inputs(processor, prompt_ids: list[int], root: Path) -> dict:
    """The processor's inputs for the prompt's text with the row's clip as verl's dataset loads it (qwen-vl-utils,
    ``fps`` 1.0): the text is the prompt's with its video run collapsed to the template's one placeholder."""
    from qwen_vl_utils import process_vision_info
    from verl.utils.tokenizer.tokenizer import build_multimodal_processor_inputs

    text = processor.tokenizer.decode(prompt_ids, skip_special_tokens=False)
    text = re.sub(r"(<\|video_pad\|>)+", "<|video_pad|>", text)
    clip = _clip_of(text, root)
    message = [{"role": "user", "content": [{"type": "video", "video": str(clip), "fps": 1.0}]}]
    _, videos = process_vision_info(message, image_patch_size=14, return_video_metadata=True)
    return dict(build_multimodal_processor_inputs(processor, text=[text], videos=videos))


def _clip_of(text: str, root: Path) -> Path:
    """The validation clip whose flash the prompt names (each row's moment differs)."""
    at = float(re.search(r"at about ([0-9.]+) s", text).group(1))
    rows = pd.read_parquet(root / "val.parquet")
    (path,) = [v[0]["video"] for v, info in zip(rows["videos"], rows["extra_info"]) if info["flash_s"] == at]
    return root / path


def _trainer_positions(processor, ids: list[int], inputs: dict) -> torch.Tensor:
    """verl's position ids for the trainer (``_compute_position_ids``) in the model's layout (4, 1, L)."""
    from types import SimpleNamespace

    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    tensor = torch.tensor([ids])
    vision = {key: value for key, value in inputs.items() if key not in ("input_ids", "attention_mask")}
    worker = SimpleNamespace(processor=processor)
    return AgentLoopWorker._compute_position_ids(worker, tensor, torch.ones_like(tensor), vision).transpose(0, 1)


def _log_probs(model, prompt_ids: list[int], token_ids: list[int], inputs: dict, positions) -> tuple[list, list]:
    """The tokens' log-probs in one float32 forward over prompt and tokens, and its greedy tokens: at ``positions``,
    or (None) at those the model computes itself from the grid alone."""
    ids = torch.tensor([prompt_ids + token_ids])
    if positions is not None:
        where = {"position_ids": positions}
    else:
        where = {"mm_token_type_ids": (ids == model.config.video_token_id).long() * 2}
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values_videos=inputs["pixel_values_videos"],
            video_grid_thw=inputs["video_grid_thw"],
            **where,
        ).logits[0]
    scores = torch.log_softmax(logits[len(prompt_ids) - 1 : -1].float(), dim=-1)
    scores[:, sorted(_vision_ids(model))] = float("-inf")  # never sampled (HFVisionLM suppresses them)
    picked = scores.gather(-1, torch.tensor(token_ids).unsqueeze(-1)).squeeze(-1).tolist()
    return picked, scores.argmax(-1).tolist()


def _vision_ids(model) -> set[int]:
    from transformers import AutoTokenizer

    from verl_mm_tools.tokens import vision_token_ids

    return vision_token_ids(AutoTokenizer.from_pretrained(model.name_or_path))


@pytest.fixture(scope="module")
def endpoint_data(video_data) -> Path:
    """The rows with their videos sampled at the processor's size."""
    data, _ = video_data
    rows = pd.read_parquet(data)
    rows["videos"] = [[{**dict(entry), **AT_PROCESSOR_SIZE} for entry in videos] for videos in rows["videos"]]
    path = data.with_name("val_at_processor_size.parquet")
    rows.to_parquet(path)
    return path


def endpoint_run(data: Path, loops: Path, tools_yaml: Path, model_dir, out: Path) -> tuple[dict, list[dict]]:
    """eval at a chat endpoint whose policy calls get_frames at the moment the prompt names, then answers the
    colour of the frames it was sent: (report, request bodies)."""
    server = PolicyChatServer(flash_policy)
    with server.running() as url:
        settings = EndpointSettings(url=url, model="tiny", retries=0)
        report = evaluate(
            options(data, loops, out, model_dir, tools_yaml), lambda tokenizer: EndpointClient(settings, tokenizer)
        )
    return report, server.requests


@pytest.fixture(scope="module")
def endpoint_eval(endpoint_data, video_data, tools_yaml, tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("endpoint_eval")
    return endpoint_run(endpoint_data, video_data[1], tools_yaml, tiny_model_dir, out)


def flash_policy(body: dict) -> dict:
    messages = body["messages"]
    if not any(message["role"] == "assistant" for message in messages):
        at = float(re.search(r"at about ([0-9.]+) s", json.dumps(messages)).group(1))
        return api_call("get_frames", json.dumps({"video_id": 1, "start_s": at, "end_s": round(at + 0.1, 2), "n": 2}))
    shown = [_png(part["image_url"]["url"]) for part in messages[-1]["content"] if part["type"] == "image_url"]
    seen = {_colour(frame.getpixel((5, 5))) for frame in shown} - {"none"}
    return answer(f"<answer>{seen.pop() if len(seen) == 1 else 'none'}</answer>")


def _png(url: str) -> Image.Image:
    header, data = url.split(",", 1)
    assert header == "data:image/png;base64"
    return Image.open(io.BytesIO(base64.b64decode(data)))


def _colour(pixel) -> str:
    for name, value in COLORS.items():
        if all(abs(int(a) - b) < 40 for a, b in zip(pixel, value, strict=True)):
            return name
    return "none"


def test_a_policy_that_calls_get_frames_on_the_flash_scores_every_row(endpoint_eval):
    report, requests = endpoint_eval
    figures = report["modes"][TOOLS][SOURCE]
    assert (figures["rows"], figures["masked"], figures["reward_mean"], figures["success_rate"]) == (ROWS, 0, 1.0, 1.0)
    assert figures["tool_calls_per_trajectory"] == 1.0
    assert len(requests) == 2 * ROWS  # the call, then the answer


def test_the_endpoint_receives_the_loops_frames_and_their_times(endpoint_eval, video_data):
    """Every request carries the prompt's video as a frame-sequence data URL: 4 lossless PNG frames of 112 px equal
    to qwen-vl-utils' sample of the clip, and media_io_kwargs giving frames 0, 13, 26, 39 of 40 at 10 fps (0, 1.3,
    2.6, 3.9 s)."""
    _, requests = endpoint_eval
    data, _ = video_data
    for body in requests:
        (video,) = [part for part in _parts(body) if part["type"] == "video_url"]
        header, frames = _video_frames(video["video_url"]["url"])
        assert header == "data:video/jpeg;base64"
        assert [frame.format for frame in frames] == ["PNG"] * FRAMES
        assert [frame.size for frame in frames] == [(SIDE, SIDE)] * FRAMES
        io_kwargs = body["media_io_kwargs"]["video"]
        assert io_kwargs == {"num_frames": FRAMES, "fps": float(FPS), "frames_indices": INDICES, "total_num_frames": 40}
        assert [index / io_kwargs["fps"] for index in io_kwargs["frames_indices"]] == [0.0, 1.3, 2.6, 3.9]
        loop_frames = _sampled(_clip_of(json.dumps(body["messages"]), data.parent))
        assert [
            list(frame.getdata()) == list(Image.fromarray(each).getdata())
            for frame, each in zip(frames, loop_frames, strict=True)
        ] == [True] * FRAMES


def _parts(body: dict) -> list[dict]:
    return [part for message in body["messages"] if isinstance(message["content"], list) for part in message["content"]]


def _video_frames(url: str) -> tuple[str, list[Image.Image]]:
    header, data = url.split(",", 1)
    return header, [Image.open(io.BytesIO(base64.b64decode(part))) for part in data.split(",")]


def _sampled(clip: Path):
    """The clip's frames as verl's dataset samples them (qwen-vl-utils, fps 1.0, at the processor's size),
    H x W x 3 uint8."""
    from qwen_vl_utils import process_vision_info

    entry = {"type": "video", "video": str(clip), "fps": 1.0, **AT_PROCESSOR_SIZE}
    message = [{"role": "user", "content": [entry]}]
    _, ((frames, _),) = process_vision_info(message, image_patch_size=14, return_video_metadata=True)
    return frames.permute(0, 2, 3, 1).to(torch.uint8).numpy()


def test_vllms_own_loader_reads_the_loops_frames_and_times(endpoint_eval, video_data):
    """vLLM 0.24's media connector, given a request's video_url and media_io_kwargs as its chat server merges them,
    returns exactly the loop's frames and the metadata its processor reads (fps, frames_indices, total_num_frames)."""
    from vllm.multimodal.media.connector import MediaConnector, merge_media_io_kwargs

    _, requests = endpoint_eval
    body = requests[0]
    (video,) = [part for part in _parts(body) if part["type"] == "video_url"]
    connector = MediaConnector(media_io_kwargs=merge_media_io_kwargs(None, body["media_io_kwargs"]))
    frames, metadata = connector.fetch_video(video["video_url"]["url"])
    loop_frames = _sampled(_clip_of(json.dumps(body["messages"]), video_data[0].parent))
    assert frames.dtype == loop_frames.dtype and np.array_equal(frames, loop_frames)
    assert {key: metadata[key] for key in ("fps", "frames_indices", "total_num_frames", "do_sample_frames")} == {
        "fps": 10.0,
        "frames_indices": INDICES,
        "total_num_frames": 40,
        "do_sample_frames": False,
    }


def test_frames_the_processor_would_resize_are_refused_by_name(video_data, tools_yaml, tiny_model_dir, tmp_path):
    """make-data's own rows: qwen-vl-utils samples 336 px frames that the tiny processor resizes to 224 px, which from
    an endpoint's 8-bit frames gives other pixel values: eval stops with the reason before sending a request."""
    data, loops = video_data
    server = PolicyChatServer(flash_policy)
    with server.running() as url, pytest.raises(ConfigError, match=r"\(336, 336\) px frames .* are resized by"):
        settings = EndpointSettings(url=url, model="tiny", retries=0)
        evaluate(options(data, loops, tmp_path, tiny_model_dir, tools_yaml), lambda t: EndpointClient(settings, t))
    assert server.requests == []
