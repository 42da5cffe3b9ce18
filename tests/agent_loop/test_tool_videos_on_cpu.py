"""A video in a tool's answer (``clip``, ``agent_loop/tool_videos.py``) through the mm_tool loop: verl's
AgentLoopWorker, the tiny Qwen2.5-VL, a real MP4 file in the prompt. The clip is rendered as the template renders a
video, joins the engine's request and the sample's videos after the prompt's, and the worker's processor pass and
M-RoPE positions cover both videos."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl_mm_tools.compact_image import expanded_inputs
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.runtime.scripted_client import tool_call_text
from verl_mm_tools.tools.video_tools import ClipTool
from verl_mm_tools.video import write_video

GREY, RED = (120, 120, 120), (220, 20, 20)
ANSWER = "<answer>red</answer>"
PROMPT_GRID, CLIP_GRID = [2, 12, 18], [3, 4, 6]  # 4 frames at 1 fps (qwen-vl-utils' 252 x 168 px); 6 at 84 x 56 px
WINDOW = {"video_id": 1, "start_s": 2.0, "end_s": 2.5, "fps": 10}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """4 s at 10 fps, 84 x 56 px; frames 23 and 24 (2.3-2.5 s) red, the others grey."""
    root = tmp_path_factory.mktemp("videos")
    frames = [np.full((56, 84, 3), RED if index in (23, 24) else GREY, np.uint8) for index in range(40)]
    write_video(root / "flash.mp4", frames, 10)
    return root


# the clip's prompt: the flash clip at qwen-vl-utils' 1 fps, which misses the flash
FLASH_PROMPT = [
    {"role": "user", "content": [{"type": "video", "video": "flash.mp4", "fps": 1.0}, {"type": "text", "text": "?"}]}
]


def _rollout(model_dir, workdir, root, calls: list[dict], **loop_options):
    prompt = FLASH_PROMPT
    turns = [tool_call_text("clip", **arguments) for arguments in calls] + [ANSWER]
    return LocalRollout(model_dir, None, workdir).run(
        turns,
        [prompt],
        columns={"extra_info": [{"index": 0}]},
        tools=[ClipTool()],
        loop_options={"file_roots": [str(root)], **loop_options},
        prompt_length=1024,
        response_length=1024,
    )


@pytest.fixture(scope="module")
def clipped(tiny_model_dir, root, tmp_path_factory):
    return _rollout(tiny_model_dir, tmp_path_factory.mktemp("work"), root, [WINDOW, {**WINDOW, "video_id": 3}])


def _tool_texts(output, worker) -> list[str]:
    text = worker.tokenizer.decode(output.batch["responses"][0], skip_special_tokens=False)
    return [part.split("<|im_end|>")[0].strip() for part in text.split("<|im_start|>user\n")[1:]]


def _row(output) -> torch.Tensor:
    ids = torch.cat([output.batch["prompts"][0], output.batch["responses"][0]])
    return ids[output.batch["attention_mask"][0].bool()]


def test_the_clip_is_rendered_as_the_templates_video_with_its_id_and_window(clipped):
    output, _, worker = clipped
    assert list(output.non_tensor_batch["mm_tool/masked"]) == [0]
    pads = "<|vision_start|>" + "<|video_pad|>" * 18 + "<|vision_end|>"  # 3 x 4 x 6 patches, 2 x 2 a token
    assert _tool_texts(output, worker) == [
        f"<tool_response>\n{pads}Video 2: Video 1 from 2.00 to 2.50 s, 6 frames at 2.00, 2.10, 2.20, 2.30, 2.40, "
        "2.50 s (84x56 px)\n</tool_response>",
        "<tool_response>\nError from clip: video_id must be between 1 and 2, got 3\n</tool_response>",
    ]
    video_pad = worker.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert int((_row(output) == video_pad).sum()) == 108 + 18


def test_the_engine_gets_every_video_in_order_and_the_sample_carries_both(clipped):
    output, client, _ = clipped
    assert [len(request["videos"]) for request in client.requests] == [1, 2, 2]
    (_, prompt_meta), (frames, clip_meta) = client.requests[1]["videos"]
    assert prompt_meta["frames_indices"] == [0, 13, 26, 39]
    assert clip_meta == {"fps": 10.0, "frames_indices": [20, 21, 22, 23, 24, 25], "total_num_frames": 6,
                         "video_backend": "pyav"}  # fmt: skip
    assert tuple(frames.shape) == (6, 3, 56, 84)
    sample = expanded_inputs(output.non_tensor_batch["multi_modal_inputs"][0])
    assert sample["video_grid_thw"].tolist() == [PROMPT_GRID, CLIP_GRID]


def test_the_samples_inputs_are_verls_own_processor_pass_over_both_videos(clipped, tiny_model_dir, root, tmp_path):
    """The compact form of both videos expands (``extract_multi_modal_inputs``) to what verl's own processor pass
    makes of the whole conversation, tensor for tensor."""
    from verl.utils.model import extract_multi_modal_inputs as extract

    from verl_mm_tools.adaptations.fixes import processed_images
    from verl_mm_tools.compact_form import VIDEO_PIXELS, NotCompactable

    def float_output(*args):
        raise NotCompactable("the baseline: verl's own float output")

    output, client, _ = clipped
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(processed_images, "compacted", float_output)
        baseline, _, _ = _rollout(tiny_model_dir, tmp_path, root, [WINDOW, {**WINDOW, "video_id": 3}])
    carried, floats = (
        output.non_tensor_batch["multi_modal_inputs"][0],
        baseline.non_tensor_batch["multi_modal_inputs"][0],
    )
    assert floats["video_grid_thw"].tolist() == [PROMPT_GRID, CLIP_GRID]
    assert floats["second_per_grid_ts"].tolist() == pytest.approx([2.0, 0.2])  # 1 fps and 10 fps, 2 frames a step
    assert VIDEO_PIXELS not in carried and "vmt_video_frames_1" in carried
    # SGLang's payload (it cannot take frames) for the turn after the clip: the same pass's pixels of both videos
    [payload] = client.requests[1]["video_payload"]
    assert payload["video_grid_thw"].tolist() == [PROMPT_GRID, CLIP_GRID]
    assert torch.equal(payload["pixel_values_videos"], floats[VIDEO_PIXELS])
    got, want = extract([carried]), extract.__wrapped__([floats])
    assert sorted(got) == sorted(want) and VIDEO_PIXELS in want
    assert all(torch.equal(got[key], want[key]) and got[key].dtype == want[key].dtype for key in want)


def test_positions_are_the_processors_get_rope_index_with_both_videos_grids_and_timing(clipped, tiny_model_dir):
    from verl.utils.tokenizer.tokenizer import hf_processor

    output, _, worker = clipped
    processor = hf_processor(tiny_model_dir)  # verl binds the model's (fixed) get_rope_index to it
    ids = _row(output).unsqueeze(0)
    types = torch.zeros_like(ids)
    types[ids == worker.tokenizer.convert_tokens_to_ids("<|video_pad|>")] = 2
    positions, _ = processor.get_rope_index(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        mm_token_type_ids=types,
        video_grid_thw=torch.tensor([PROMPT_GRID, CLIP_GRID]),
        second_per_grid_ts=torch.tensor([2.0, 0.2]),
    )
    loop = output.batch["position_ids"][0][..., output.batch["attention_mask"][0].bool()]
    assert torch.equal(loop[1:], positions[:, 0])
    assert not torch.equal(positions[0, 0], positions[1, 0])  # M-RoPE: the videos' own temporal positions


def test_the_budget_counts_the_clips_tokens_and_refuses_one_over_it(tiny_model_dir, root, tmp_path):
    output, client, worker = _rollout(tiny_model_dir, tmp_path, root, [WINDOW], max_image_tokens=120)
    assert _tool_texts(output, worker) == [
        "<tool_response>\nNote: the image token budget is exhausted (12 image tokens left, the video needs 18); the "
        "video was not shown: ask for fewer frames (a lower fps or a shorter window).\n</tool_response>"
    ]
    assert [len(request["videos"]) for request in client.requests] == [1, 1]
    assert list(output.non_tensor_batch["mm_tool/masked"]) == [0]


class FixedVideoTool(ClipTool):
    """Answers every call with one 2-frame video: the refusal needs no prompt video (these families' tiny models are
    not run with one here)."""

    async def execute(self, instance_id, parameters, **kwargs):
        from verl.tools.schemas import ToolResponse

        metadata = {"fps": 10.0, "frames_indices": [0, 1], "total_num_frames": 2, "video_backend": "pyav"}
        return ToolResponse(video=[(torch.zeros(2, 3, 56, 84), metadata)], text="Video 1: a clip"), 0.0, {}


@pytest.mark.parametrize(("family", "processor"), [("glm4v", "Glm4vProcessor"), ("gemma4", "Gemma4Processor")])
def test_a_family_that_cannot_render_it_is_told_so_by_name(tmp_path, family, processor):
    from verl_mm_tools.tiny import tiny_model_path

    model_dir = tiny_model_path(family=family)
    turns = [tool_call_text("clip", **WINDOW), ANSWER]
    output, client, worker = LocalRollout(model_dir, None, tmp_path).run(
        turns,
        [[{"role": "user", "content": "Which colour?"}]],
        columns={"extra_info": [{"index": 0}]},
        tools=[FixedVideoTool()],
        prompt_length=1024,
        response_length=1024,
    )
    text = worker.tokenizer.decode(output.batch["responses"][0], skip_special_tokens=False)
    note = (
        f"Note: this model ({processor}) cannot be shown a video in a tool's answer (supported: Qwen2-VL, "
        "Qwen2.5-VL, Qwen3-VL, Qwen3.5); the tool's video was dropped."
    )
    assert note in text and "a clip" not in text
    assert [len(request["videos"]) for request in client.requests] == [0, 0]
    assert list(output.non_tensor_batch["mm_tool/masked"]) == [0]


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_5"])
def test_qwen3_vl_renders_the_clip_with_its_frame_groups_timestamps(root, tmp_path, family):
    """Qwen3-VL's processor (Qwen3.5's too) writes a video as a ``<t seconds>`` stamp and a run per 2-frame group:
    the clip's stamps are times in Video 1 (its window starts at 2.0 s)."""
    from verl_mm_tools.tiny import tiny_model_path

    output, client, worker = _rollout(tiny_model_path(family=family), tmp_path, root, [WINDOW])
    run = "<|vision_start|>" + "<|video_pad|>" * 6 + "<|vision_end|>"
    assert _tool_texts(output, worker)[0].startswith(
        f"<tool_response>\n<2.0 seconds>{run}<2.2 seconds>{run}<2.5 seconds>{run}Video 2: Video 1 from 2.00 to 2.50 s"
    )
    sample = expanded_inputs(output.non_tensor_batch["multi_modal_inputs"][0])
    assert sample["video_grid_thw"].tolist() == [[2, 6, 8], [3, 4, 6]]
    assert [len(request["videos"]) for request in client.requests] == [1, 2]
    assert list(output.non_tensor_batch["mm_tool/masked"]) == [0]


def test_the_record_keeps_the_clip_and_rescore_and_export_sft_refuse_it_by_name(tiny_model_dir, root, tmp_path):
    """Record version 8: the clip gets its entry like a prompt video (source tool, its turn, the frames' times and
    shown size, a strip), named by the tool message that holds it; the viewer shows it. rescore and export-sft
    rebuild prompt videos only: a record with a tool's video is refused by name."""
    from PIL import Image

    from verl_mm_tools.record import STAGED_RECORD_FILE, STAGING_DIR, RecordError
    from verl_mm_tools.runtime.config import CLASSIC_HOOK
    from verl_mm_tools.trajectories.read import read_checked
    from verl_mm_tools.trajectories.rescore_input import recorded_videos
    from verl_mm_tools.trajectories.sft_videos import TOOL_VIDEO, VideoRefused, VideoRows
    from verl_mm_tools.viewer.html import trajectory_page

    prompt = FLASH_PROMPT
    LocalRollout(tiny_model_dir, None, tmp_path).run(
        [tool_call_text("clip", **WINDOW), ANSWER],
        [prompt],
        columns={"extra_info": [{"index": 0}]},
        tools=[ClipTool()],
        loop_options={"file_roots": [str(root)], "dump_dir": str(tmp_path / "dump")},
        prompt_length=1024,
        response_length=1024,
        extra=CLASSIC_HOOK,
    )
    [staged] = (tmp_path / "dump" / STAGING_DIR).glob(f"*/{STAGED_RECORD_FILE}")
    loaded = read_checked(staged)
    record = loaded.record
    times = [2.0, 2.1, 2.2, 2.3, 2.4, 2.5]
    strip = [{"time_s": time, "thumb": f"videos/2_{position + 1}.thumb.jpg"} for position, time in enumerate(times)]
    assert record["version"] == 9
    assert record["videos"][1] == {"id": 2, "source": "tool", "turn": 1, "path": None, "times_s": times,
                                   "width": 84, "height": 56, "strip": strip}  # fmt: skip
    assert [record["videos"][0][key] for key in ("id", "source", "turn")] == [1, "prompt", 0]
    assert [(message["role"], message.get("video_ids")) for message in record["messages"]] == [
        ("user", [1]), ("assistant", None), ("tool", [2]), ("assistant", None)
    ]  # fmt: skip
    with Image.open(staged.parent / "videos/2_4.thumb.jpg") as frame:  # 2.3 s: the flash
        red, green, _ = frame.convert("RGB").getpixel((42, 28))
        assert red - green > 100
    html = trajectory_page(record, "files", "index.html", (None, None))
    assert "Video 2: 6 frames at 2, 2.1, 2.2, 2.3, 2.4, 2.5 s (84x56 px), a tool&#x27;s answer in turn 1" in html
    with pytest.raises(RecordError, match="video 2 is a tool's answer \\(turn 1\\); rescore rebuilds prompt videos "):
        recorded_videos(loaded)
    with pytest.raises(VideoRefused) as refused:
        VideoRows(None).of(loaded)
    assert refused.value.reason == TOOL_VIDEO


def test_per_turn_samples_hold_the_clip_from_the_turn_after_it(tiny_model_dir, root, tmp_path):
    """``export: per_turn``: the first turn's sample holds the prompt's video only, the second's both (the template's
    render of the conversation, the clip in its tool message); each passes the token check."""
    from verl_mm_tools.agent_loop.hook_config import MANAGER_TQ_OVERRIDE
    from verl_mm_tools.runtime.batch import unpadded_row

    prompt = FLASH_PROMPT
    output, client, _ = LocalRollout(tiny_model_dir, None, tmp_path).run(
        [tool_call_text("clip", **WINDOW), ANSWER],
        [prompt],
        columns={"extra_info": [{"index": 0}]},
        tools=[ClipTool()],
        loop_options={"file_roots": [str(root)], "export": "per_turn"},
        prompt_length=1024,
        response_length=1024,
        per_sample=True,
        extra=("trainer.use_v1=true", MANAGER_TQ_OVERRIDE),  # several samples: the v1 trainer and its manager
    )
    grids = [
        expanded_inputs(inputs)["video_grid_thw"].tolist() for inputs in output.non_tensor_batch["multi_modal_inputs"]
    ]
    assert grids == [[PROMPT_GRID], [PROMPT_GRID, CLIP_GRID]]
    assert list(output.non_tensor_batch["mm_tool/masked"]) == [0, 0]
    assert [unpadded_row(output, index)["prompt_ids"] for index in (0, 1)] == [
        request["prompt_ids"] for request in client.requests
    ]  # what the model saw is what each sample trains on


@pytest.mark.parametrize(
    ("video", "note"),
    [
        ("clip.mp4", "the tool returned a str instead of a (frames, metadata) video; it was dropped"),
        ((np.zeros((2, 3, 8, 8)), {}), "the tool's video frames are not a T x 3 x H x W tensor; it was dropped"),
        (
            (torch.zeros(1, 3, 8, 8), {"fps": 1.0, "frames_indices": [0]}),
            "the tool's video has 1 frames of 8x8 px, outside 2..768 frames of at most 67108864 px; it was dropped",
        ),
        (
            (torch.zeros(2, 3, 8, 8), {"fps": 1.0, "frames_indices": [0]}),
            "the tool's video metadata does not time its frames (fps and one frames_indices each); it was dropped",
        ),
    ],
)
def test_a_malformed_tool_video_is_dropped_with_what_was_wrong(video, note):
    from verl_mm_tools.agent_loop.tool_videos import _malformed

    assert _malformed(video) == note


def test_a_tool_turn_that_does_not_fit_takes_its_clip_with_it(tiny_model_dir, root, tmp_path):
    """The response budget drops the whole tool turn: the clip leaves the trajectory's videos, its budget and SGLang's
    payload with it (``Checkpoint.restore``), and the sample holds the prompt's video only."""
    prompt = FLASH_PROMPT
    output, client, _ = LocalRollout(tiny_model_dir, None, tmp_path).run(
        [tool_call_text("clip", **WINDOW), ANSWER],
        [prompt],
        columns={"extra_info": [{"index": 0}]},
        tools=[ClipTool()],
        loop_options={"file_roots": [str(root)]},
        prompt_length=1024,
        response_length=64,  # the call fits, its answer (18 video tokens and the text) does not
    )
    assert len(client.requests) == 1
    assert list(output.non_tensor_batch["mm_tool/masked"]) == [0]
    assert str(output.non_tensor_batch["mm_tool/stop_reason"][0]) == "length_limit"
    assert expanded_inputs(output.non_tensor_batch["multi_modal_inputs"][0])["video_grid_thw"].tolist() == [PROMPT_GRID]
