"""Multi-turn SFT rows with videos, rendered as the rollout rendered them. verl's ``MultiTurnSFTDataset`` samples a
row's video with qwen-vl-utils (``process_video``) but keeps only the frames: the file's frame rate, the indices of
the frames taken and the frames in range are dropped, and the message is rendered without them, so transformers'
Qwen processors fall back to their defaults: Qwen2.5-VL's ``second_per_grid_ts`` (the video's temporal M-RoPE
positions) and Qwen3-VL's timestamp tokens ("<0.5 seconds>") differ from the rollout's. Its position ids then come
from verl's own Qwen2-VL ``get_rope_index`` (2 tokens per second whatever the model's config; one grid per vision
start, which Qwen3-VL's per-frame timestamps split into many), not from the model's, which verl binds to the
processor and the rollout used. Fixed: the SFT dataset's ``process_video`` keeps the metadata beside the frames
(``SampledVideo``), each message and the whole conversation are rendered with it (``video_metadata``,
``do_sample_frames: False``, as verl's rollout passes them), and a row with videos gets its position ids as verl's
rollout computes them (``AgentLoopWorker._compute_position_ids``: the processor's ``get_rope_index``). Rows without
videos are read as before; other datasets' ``process_video`` and ``get_rope_index`` are left alone."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from verl_mm_tools.adaptations.guard import calling, mark
from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    import torch
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

SFT_DATASET_MODULE = "verl.utils.dataset.multiturn_sft_dataset"
PROCESS_VIDEO = Target(
    SFT_DATASET_MODULE, "process_video", "73b45b2a6ecfb171abccb4bdae0a7fcd39c6d4385a43016a2d05373daa9851f5"
)
ROPE_INDEX = Target(
    SFT_DATASET_MODULE, "get_rope_index", "777fada1eaca6c49a6b76d77940557fe753ea75d07d61ea655f6b12258c60b75"
)
SINGLE_MESSAGE = Target(
    SFT_DATASET_MODULE,
    "MultiTurnSFTDataset._process_single_message",
    "7f2845ae1e87a946c0256f1b53640d239944f9657ce0346a1be5bd7d031dd9e6",
)
SANITY_CHECK = Target(
    SFT_DATASET_MODULE,
    "MultiTurnSFTDataset.sanity_check",
    "b62fcf338cc4a7f345c24e22c08001256a8ec961fb8804423389b634456fe316",
)
# checked only: that it renders each message by _process_single_message, the whole by sanity_check, and takes its
# position ids from the module's get_rope_index
GET_ITEM = Target(
    SFT_DATASET_MODULE,
    "MultiTurnSFTDataset.__getitem__",
    "8dda397d5ecf6aa961d65340350a087b360ab5956f1abc03b2ba29106066bd56",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(PROCESS_VIDEO, ROPE_INDEX, SINGLE_MESSAGE, SANITY_CHECK, GET_ITEM),
    what="the SFT dataset's `process_video` keeps qwen-vl-utils' sampling metadata beside the frames; each message "
    "and the whole conversation are rendered with it (`video_metadata`, `do_sample_frames: False`, as verl's rollout "
    "passes them); a row with videos gets its position ids from the processor's `get_rope_index`, as verl's rollout "
    "computes them. Only in `multiturn_sft_dataset`; rows without videos unchanged",
    why="verl's SFT dataset drops the sampling metadata, so the processor renders a video at its default 2 fps: "
    "Qwen2.5-VL's temporal M-RoPE positions and Qwen3-VL's timestamp tokens differ from the rollout's (Qwen3-VL's "
    "whole-conversation check then fails); and its own Qwen2-VL `get_rope_index` takes 2 tokens per second whatever "
    "the model's config, and cannot place Qwen3-VL's per-frame runs",
    applies_to=f"{VERL} with transformers 5.9",
    proof="`tests/trajectories/test_export_sft_videos_on_cpu.py::"
    "test_verls_own_sft_dataset_renders_the_videos_at_its_default_sampling`",
)


class SampledVideo(NamedTuple):
    """A video's frames (T x C x H x W) and qwen-vl-utils' metadata of them (``fps``, ``frames_indices``,
    ``total_num_frames``): what the processor needs to render them as the rollout did."""

    frames: torch.Tensor
    metadata: dict


@ADAPTATION.installs
def install(process_video: Callable[..., Any], get_rope_index: Callable[..., Any], *_methods: object) -> None:
    """The module's own names only: verl's RL dataset and SGLang's schemas bind the same functions."""
    import importlib

    module = importlib.import_module(SFT_DATASET_MODULE)
    module.process_video = mark(calling(sampled_video, process_video))  # type: ignore[attr-defined]
    module.get_rope_index = mark(calling(rope_index, get_rope_index))  # type: ignore[attr-defined]


@ADAPTATION.implements
def sampled_video(process_video: Callable[..., Any], video: dict, **kwargs: Any) -> SampledVideo:
    frames, metadata = process_video(video, **kwargs, return_video_metadata=True)
    return SampledVideo(frames, metadata)


@ADAPTATION.replaces(SINGLE_MESSAGE)
def _process_single_message(
    process: Callable[..., tuple],
    self: MultiTurnSFTDataset,
    index: int,
    message: dict[str, Any],
    full_message: list,
    tools: list[dict[str, Any]] | None = None,
    enable_thinking: bool | None = None,
) -> tuple:
    (message,), metadata = split_videos([message])
    with rendering_videos(self, metadata):
        return process(self, index, message, full_message, tools, enable_thinking)


@ADAPTATION.replaces(SANITY_CHECK)
def sanity_check(
    check: Callable[..., None],
    self: MultiTurnSFTDataset,
    input_ids: torch.Tensor,
    messages: list[dict],
    tools: list[dict],
    enable_thinking: bool,
) -> None:
    messages, metadata = split_videos(messages)
    with rendering_videos(self, metadata):
        check(self, input_ids, messages, tools, enable_thinking)


@ADAPTATION.implements
def split_videos(messages: list[dict]) -> tuple[list[dict], list[dict]]:
    """The messages with each ``SampledVideo`` replaced by its frames, and the videos' metadata in order."""
    found: list[dict] = []
    return [_frames_only(message, found) for message in messages], found


def _frames_only(message: dict, found: list[dict]) -> dict:
    content = message.get("content")
    if not isinstance(content, list) or not any(isinstance(part.get("video"), SampledVideo) for part in content):
        return message
    parts = []
    for part in content:
        video = part.get("video")
        if isinstance(video, SampledVideo):
            found.append(video.metadata)
            part = {**part, "video": video.frames}
        parts.append(part)
    return {**message, "content": parts}


@contextmanager
def rendering_videos(dataset: MultiTurnSFTDataset, metadata: list[dict]) -> Iterator[None]:
    """verl's render of ``dataset``'s messages with the videos' metadata passed to the processor (the chat template
    kwargs verl reads at each render, restored after)."""
    if not metadata:
        yield
        return
    kwargs = dataset.apply_chat_template_kwargs
    processor_kwargs = {**kwargs.get("processor_kwargs", {}), "video_metadata": metadata, "do_sample_frames": False}
    dataset.apply_chat_template_kwargs = {**kwargs, "processor_kwargs": processor_kwargs}
    try:
        yield
    finally:
        dataset.apply_chat_template_kwargs = kwargs


@ADAPTATION.implements
def rope_index(
    verls_own: Callable[..., torch.Tensor],
    processor: Any,
    input_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    second_per_grid_ts: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """(3, length) M-RoPE positions of one row: with videos, the model's own ``get_rope_index`` (bound to the
    processor by verl's ``hf_processor``) as verl's rollout calls it; otherwise, or for a processor without one,
    verl's own."""
    if video_grid_thw is None or not hasattr(processor, "get_rope_index"):
        return verls_own(processor, input_ids, image_grid_thw, video_grid_thw, second_per_grid_ts, attention_mask)
    import torch
    from verl.utils.tokenizer.tokenizer import get_processor_token_id

    ids = input_ids.unsqueeze(0)
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask.unsqueeze(0)
    token_types = torch.zeros_like(ids)
    for kind, value in (("image", 1), ("video", 2)):  # transformers' mm_token_type_ids
        token_id = get_processor_token_id(processor, kind)
        if token_id is not None:
            token_types[ids == token_id] = value
    grids = {"image_grid_thw": image_grid_thw, "video_grid_thw": video_grid_thw}
    hook = getattr(processor, "get_rope_index_kwargs", None)  # verl's hook (Qwen2.5-VL's second_per_grid_ts)
    extra = hook({**grids, "second_per_grid_ts": second_per_grid_ts}) if hook is not None else {}
    positions, _ = processor.get_rope_index(
        input_ids=ids, attention_mask=mask, mm_token_type_ids=token_types, **grids, **extra
    )
    return positions[:, 0, :]
