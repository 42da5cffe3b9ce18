"""Videos in the prompt through the mm_tool loop (``prompt_videos``, the budget's video tokens, the token check):
verl's AgentLoopWorker, the tiny Qwen2.5-VL, real MP4 files read by qwen-vl-utils through the PyAV reader."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.video import write_video

ANSWER = "<answer>red</answer>"


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    root, outside = tmp_path_factory.mktemp("root"), tmp_path_factory.mktemp("outside")
    frames = [np.full((56, 84, 3), (200, 20, 20), np.uint8) for _ in range(40)]
    write_video(root / "clip.mp4", frames, 10)  # 4 s
    write_video(outside / "secret.mp4", frames, 10)
    return root, outside


def _prompt(video: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "video", **video}, {"type": "text", "text": "Which colour?"}]}]


def _run(model_dir, workdir, root, videos, **loop_options):
    prompts = [_prompt(video) for video in videos]
    columns = {"extra_info": [{"index": index} for index in range(len(videos))]}
    options = {"file_roots": [str(root)], **loop_options}
    return LocalRollout(model_dir, None, workdir).run(
        [ANSWER], prompts, columns=columns, loop_options=options, prompt_length=1024
    )


@pytest.fixture(scope="module")
def batch(tiny_model_dir, roots, tmp_path_factory):
    root, outside = roots
    frames = [Image.new("RGB", (56, 56), (0, 0, 200 + i)) for i in range(4)]
    videos = [
        {"video": "clip.mp4", "fps": 1.0},  # relative to the first root
        {"video": f"file://{root}/clip.mp4", "nframes": 8, "video_start": 1.0},
        {"video": frames, "sample_fps": 2.0},
        {"video": str(outside / "secret.mp4")},
        {"video": "clip.mp4", "resized_height": 4000, "resized_width": 4000},
        {"video": "clip.mp4", "video_start": 4.0},
        {"video": "http://192.0.2.1/clip.mp4"},
    ]
    output, _, worker = _run(tiny_model_dir, tmp_path_factory.mktemp("work"), root, videos)
    return output, worker


def _video_pads(output, worker, index):
    ids = torch.cat([output.batch["prompts"][index], output.batch["responses"][index]])
    return int((ids == worker.tokenizer.convert_tokens_to_ids("<|video_pad|>")).sum())


def test_video_files_and_frames_reach_the_model_as_the_processor_renders_them(batch):
    output, worker = batch
    # qwen-vl-utils' sampling: 4 frames (1 fps over 4 s), 8 frames (from 1 s), the 4 frames given; each pair of
    # frames one temporal patch of 14 x 14 px patches, 2 x 2 patches a token; the sizes are qwen-vl-utils' and the
    # tiny processor's resizes of the 84 x 56 and 56 x 56 px frames
    grids = [output.non_tensor_batch["multi_modal_inputs"][index]["video_grid_thw"].tolist() for index in range(3)]
    assert grids == [[[2, 12, 18]], [[4, 12, 18]], [[2, 16, 16]]]
    assert [_video_pads(output, worker, index) for index in range(3)] == [108, 216, 128]
    assert list(output.non_tensor_batch["mm_tool/masked"][:3]) == [0, 0, 0]


def test_the_videos_go_as_their_frames_and_reach_the_forward_as_verls_own_float_output(
    batch, tiny_model_dir, roots, tmp_path
):
    """The samples carry their prompt videos as uint8 frames (``compact_video``); verl's ``extract_multi_modal_inputs``
    (fixed: ``adaptations/fixes/compact_images.py``) gives a micro-batch of them the same tensors as verl's own
    function gives the float samples of the same rollout without the compact form."""
    from verl.utils.model import extract_multi_modal_inputs as extract

    from verl_mm_tools.adaptations.fixes import processed_images
    from verl_mm_tools.compact_form import VIDEO_PIXELS, NotCompactable

    def float_output(*args):
        raise NotCompactable("the baseline: verl's own float output")

    output, _ = batch
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(processed_images, "compacted", float_output)
        frames = [Image.new("RGB", (56, 56), (0, 0, 200 + i)) for i in range(4)]
        videos = [
            {"video": "clip.mp4", "fps": 1.0},
            {"video": f"file://{roots[0]}/clip.mp4", "nframes": 8, "video_start": 1.0},
            {"video": frames, "sample_fps": 2.0},
        ]
        baseline, _, _ = _run(tiny_model_dir, tmp_path, roots[0], videos)
    carried, floats = (list(each.non_tensor_batch["multi_modal_inputs"][:3]) for each in (output, baseline))
    # the frames the video processor was called with, as uint8 (qwen-vl-utils' sizes: 4 and 8 frames of 280 x 392 px,
    # at least its 100,352 px; 4 of 336 x 336 px), against the float32 output (the tiny processor shrinks them)
    assert [sum(v.numel() for k, v in each.items() if k.startswith("vmt_video_frames_")) for each in carried] == [
        1_317_120,
        2_634_240,
        1_354_752,
    ]
    assert [each[VIDEO_PIXELS].numel() for each in floats] == [508_032, 1_016_064, 602_112]
    assert not any(VIDEO_PIXELS in each for each in carried)
    got, want = extract(carried), extract.__wrapped__(floats)
    assert sorted(got) == sorted(want) and VIDEO_PIXELS in want
    assert all(torch.equal(got[key], want[key]) and got[key].dtype == want[key].dtype for key in want)


def test_bad_videos_mask_their_own_trajectory_with_what_was_wrong(batch, roots):
    output, _ = batch
    root, outside = roots
    errors = list(output.non_tensor_batch["mm_tool/error"][3:])
    assert errors == [
        f"FileAccessError: sample 3, prompt video 1: refused to read '{outside}/secret.mp4': it resolves to "
        f"'{outside}/secret.mp4', outside the file roots ['{root}']; move the file under a root or add a root",
        "VideoInputError: sample 4, prompt video 1: resized_height x resized_width = 4000 x 4000 px is more than the "
        "1048576 px a frame may have",
        "VideoInputError: sample 5, prompt video 1: video_start=4.0 s is at or after its end (4 s)",
        "FileAccessError: sample 6, prompt video 1: refused to fetch 'http://192.0.2.1/clip.mp4': only local files "
        "under the file roots are read; download it under a root first",
    ]
    assert list(output.non_tensor_batch["mm_tool/masked"][3:]) == [1, 1, 1, 1]


def test_the_videos_tokens_count_against_the_image_token_budget(tiny_model_dir, roots, tmp_path):
    videos = [{"video": "clip.mp4", "fps": 1.0}]
    output, _, _ = _run(tiny_model_dir, tmp_path, roots[0], videos, max_image_tokens=100)
    assert list(output.non_tensor_batch["mm_tool/error"]) == [
        "ImageBudgetError: the prompt's images need 108 image tokens (108 of them its videos'), more than "
        "max_image_tokens=100; raise max_image_tokens, or sample the videos with fewer frames or pixels (fps, "
        "nframes, max_pixels in the video entries)"
    ]


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"fps": True}, "fps=True must be a number in [0.001, 60]"),
        ({"fps": float("nan")}, "fps=nan must be a number in [0.001, 60]"),
        ({"nframes": "8"}, "nframes='8' must be a whole number in [2, 768]"),
        ({"nframes": 2.5}, "nframes=2.5 must be a whole number in [2, 768]"),
        ({"nframes": 10_000}, "nframes=10000 must be a whole number in [2, 768]"),
        ({"fps": 1.0, "nframes": 4}, "give fps or nframes, not both (fps=1.0, nframes=4)"),
        ({"min_frames": 8, "max_frames": 4}, "min_frames=8 must be less than max_frames=4"),
        ({"video_start": 2.0, "video_end": 1.0}, "video_start=2.0 must be less than video_end=1.0"),
        ({"nframes": 32, "video_start": 2.0}, "nframes=32 asks for more frames than its 2-4 s hold (20)"),
        ({"video_start": 3.95}, "its 3.95-4 s hold 0 frame(s); qwen-vl-utils needs 2 or more"),
    ],
)
def test_sampling_keys_outside_what_qwen_vl_utils_reads_safely_are_refused(roots, keys, message):
    from verl_mm_tools.agent_loop.prompt_videos import safe_video_item
    from verl_mm_tools.errors import VideoInputError
    from verl_mm_tools.files import FileRoots

    root, _ = roots
    with pytest.raises(VideoInputError) as refused:
        safe_video_item({"video": "clip.mp4", **keys}, FileRoots.from_config(root), "v", lambda frame, name: frame)
    assert str(refused.value) == f"v: {message}"


def test_a_checked_video_entry_names_the_real_path(roots):
    from verl_mm_tools.agent_loop.prompt_videos import safe_video_item
    from verl_mm_tools.files import FileRoots

    root, _ = roots
    item = safe_video_item({"video": "./clip.mp4", "fps": 2}, FileRoots.from_config(root), "v", lambda f, n: f)
    assert item == {"type": "video", "video": str(root / "clip.mp4"), "fps": 2}
