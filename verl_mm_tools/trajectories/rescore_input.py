"""The batch a reward manager gets for one recorded trajectory (``manager_input``), as in training.

A manager gets what verl's ``AgentLoopWorker._compute_score`` hands the reward worker in training (the streaming
reward path, the one training and ``verl-mm-tools eval`` score on), rebuilt from the record, which keeps text and
token counts but no token ids (``manager_input``):

- one row, the trajectory's final training sample (the only one unless the loop's ``export`` was per_turn or auto,
  and the one verl's v1 manager scores: ``adaptations.manager_tq``): ``prompts`` and ``responses`` re-tokenised
  from the record's ``chat`` (the conversation as the chat template rendered it in the loop) by the model's chat
  template and processor, image placeholders expanded from the record's PNGs (the pixels the model saw) and video
  placeholders from the record's video entries (frames of the recorded count and size, at the recorded times: the
  placeholders depend on those alone, and the reward managers read text, so no video file is read). Every
  sample is rebuilt, to check its counts against the record's: its prompt is the render of the conversation before
  its first turn, with the generation prompt; its response the rest of the render up to its last turn, cut to the
  recorded response length (the loop's response ends at the generated end-of-turn token, before the newline the
  template writes after it, and is cut at ``response_length``). A masked trajectory's response is one eos token, as
  the loop's stand-in output. Where the rebuilt counts differ from the record's (a template that rewrites history,
  a masked trajectory whose prompt never rendered), the row says ``tokens_as_recorded: false``;
- ``attention_mask`` ones, ``input_ids`` prompt + response, ``position_ids`` 0..n-1 (plain: M-RoPE ids need the
  model's vision config and pixel inputs; no manager of verl's or ours reads them);
- the dataset row's columns ``data_source``, ``reward_model.ground_truth``, ``extra_info``, ``index``, ``uid`` from
  the record's ``sample`` (with ``--reward-fn``, ``extra_info.reward_fn`` is replaced: a row naming its own function
  would otherwise keep it under ``mm_turn_discount``; with ``--judge``, removed: the judge scores every record).
  Not recorded, not rebuilt: ``raw_prompt``, ``tools_kwargs`` and ``reward_model.style`` (only a reward model reads
  the raw prompt, and rescore runs none);
- ``tool_extra_fields``: the loop's extra fields from the record's ``stats`` (``mm_tool/`` prefix restored;
  ``attempts``, ``tool_call_counts``, ``turn_scores``, ``tool_rewards``, per-turn ``mm_tool/turn_rewards``), plus
  ``last_assistant_text`` (not in ``stats``): the last assistant message re-tokenised and decoded without special
  tokens, as the loop decodes it (verl's own extra fields, the server's weight versions, are not recorded), and
  with ``--judge`` the judge's view of it (``mm_tool/judge_context``: ``rescore_judge``);
- ``__num_turns__``: assistant turns + tool and environment turns + 1, as verl counts them (1 for a masked one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
from PIL import Image

from verl_mm_tools.handoff import LAST_ASSISTANT_TEXT_KEY, PREFIX, SampleFields
from verl_mm_tools.image_window import windowed
from verl_mm_tools.judge.context import ImageChoice
from verl_mm_tools.record import STATS_KEYS, RecordError, chat_image_ids, chat_video_ids
from verl_mm_tools.runtime.batch import object_array
from verl_mm_tools.trajectories.read import LoadedRecord
from verl_mm_tools.trajectories.rescore_judge import record_judge_context
from verl_mm_tools.video import DECODE_MAX_PIXELS

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig
    from transformers import PreTrainedTokenizerBase, ProcessorMixin
    from verl.protocol import DataProto


@dataclass
class ManagerInput:
    data: DataProto  # one row per training sample
    fields: dict
    tokens_as_recorded: bool


class ChatRenderer:
    """The model's chat template and processor: a conversation of the record's ``chat`` to token ids, images
    expanded as the loop's processor call expanded them."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        processor: ProcessorMixin | None,
        mm_processor_kwargs: dict | None = None,
    ):
        self.tokenizer = tokenizer
        self.processor = processor
        self.mm_processor_kwargs = mm_processor_kwargs or {}

    @classmethod
    def load(cls, model_path: str, config: DictConfig) -> ChatRenderer:
        """The model's tokenizer and processor as verl's agent-loop worker loads them, with the processor kwargs of
        verl's config (``data.mm_processor_kwargs``)."""
        from omegaconf import OmegaConf
        from verl.utils import hf_processor, hf_tokenizer

        mm_processor_kwargs = cast("dict | None", OmegaConf.to_container(config.data.mm_processor_kwargs, resolve=True))
        return cls(hf_tokenizer(model_path), hf_processor(model_path), mm_processor_kwargs)

    def token_ids(
        self,
        messages: list[dict],
        images: list[Image.Image],
        chat: dict,
        add_generation_prompt: bool,
        videos: Sequence[RecordedVideo] = (),
    ) -> list[int]:
        from verl.utils.tokenizer.chat_template import apply_chat_template
        from verl.utils.tokenizer.tokenizer import build_multimodal_processor_inputs, normalize_token_ids

        text = apply_chat_template(
            self.processor or self.tokenizer,
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            tools=chat.get("tools"),
            **(chat.get("template_kwargs") or {}),
        )
        if self.processor is None:
            return self.tokenizer.encode(text, add_special_tokens=False)
        inputs = build_multimodal_processor_inputs(
            self.processor,
            text=[text],
            images=images or None,
            videos=[video.processor_input() for video in videos] or None,
            mm_processor_kwargs=self.mm_processor_kwargs or None,
        )
        return normalize_token_ids(inputs["input_ids"])

    def plain_text(self, text: str) -> str:
        """``text`` (decoded with special tokens) as the loop decodes generated tokens for the reward managers:
        re-tokenised, decoded without special tokens."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=True))  # one sequence: one text


def manager_input(
    item: LoadedRecord, renderer: ChatRenderer, reward_fn: str | None, judge_images: ImageChoice | None = None
) -> ManagerInput:
    """What verl's ``AgentLoopWorker._compute_score`` hands the reward worker for this trajectory (module doc); with
    ``judge_images`` (``rescore --judge``), also what the judge sees of it."""
    record = item.record
    chat = record.get("chat")
    if not chat:
        raise RecordError(
            f"{item.path}: record version {record.get('version')} has no rendered conversation ('chat', records of "
            "version 4 on): its response tokens cannot be rebuilt for the reward manager; re-record it"
        )
    messages = template_messages(record, chat)
    images, videos = _images(item), recorded_videos(item)
    if (images or videos) and renderer.processor is None:
        raise RecordError(
            f"{item.path}: its images and videos need the model's processor to rebuild their placeholder tokens, and "
            f"{record.get('model')} has none that loads: pass --model-path of the model that generated it"
        )
    samples, as_recorded = [], True
    for sample in record.get("samples") or []:
        prompt, response, matches = sample_tokens(record, sample, messages, images, chat, renderer, videos)
        samples.append((prompt, response))
        as_recorded = as_recorded and matches
    if not samples:
        raise RecordError(f"{item.path}: the record lists no training sample ('samples'): nothing to score")
    fields = loop_fields(item, renderer)
    if judge_images is not None:
        fields[SampleFields.key("judge_context")] = record_judge_context(
            item, judge_images, fields[LAST_ASSISTANT_TEXT_KEY]
        )
    row = row_columns(record, reward_fn, judged=judge_images is not None)
    data = _data_proto(*samples[-1], row, fields, num_turns(record))
    return ManagerInput(data, fields, as_recorded)


def template_messages(record: dict, chat: dict) -> list[dict]:
    """The record's rendered conversation as the chat template takes it (image parts as ``{"type": "image"}``, the
    pixels passed to the processor in order), plus the turns cut by a length or turn limit, which never became a
    message (the record keeps their text with its messages)."""
    messages = [_template_message(message) for message in chat["messages"]]
    in_chat = sum(message["role"] == "assistant" for message in messages)
    assistants = [message for message in record.get("messages") or [] if message.get("role") == "assistant"]
    messages += [{"role": "assistant", "content": message["text"]} for message in assistants[in_chat:]]
    return messages


def _template_message(message: dict) -> dict:
    content = message.get("content")
    if isinstance(content, list):
        content = [{"type": part["type"]} if part.get("type") in ("image", "video") else part for part in content]
    return {**message, "content": content}


def _images(item: LoadedRecord) -> list[Image.Image]:
    """The pixels of the record's images in the rendered conversation's order (the ids in ``chat``)."""
    images = []
    for image_id in chat_image_ids(item.record["chat"]):
        with Image.open(item.image_file(image_id)) as image:
            images.append(image.copy())
    return images


@dataclass(frozen=True)
class RecordedVideo:
    """A prompt video as the record keeps it: its frames' count, shown size and times."""

    times_s: tuple[float, ...]
    width: int
    height: int

    def processor_input(self) -> tuple[torch.Tensor, dict]:
        """Black frames of the recorded count and size, and metadata that puts them at the recorded times (frame
        indices in ms): the processor's placeholders (grid, timestamps) depend on nothing else."""
        import torch

        # one black frame, repeated without copies: the processor makes its own
        frames = torch.zeros((1, 3, self.height, self.width), dtype=torch.uint8).expand(len(self.times_s), -1, -1, -1)
        indices = [round(time * 1000) for time in self.times_s]
        return frames, {"fps": 1000.0, "frames_indices": indices, "total_num_frames": indices[-1] + 1}


def recorded_videos(item: LoadedRecord) -> list[RecordedVideo]:
    """The record's prompt videos in the rendered conversation's order; a RecordError where the conversation does
    not say where they were (records before version 8) or one lacks its frames' times or size."""
    videos = item.record.get("videos") or []
    if not videos:
        return []
    ids = chat_video_ids(item.record["chat"])
    if ids != [video["id"] for video in videos]:
        raise RecordError(
            f"{item.path}: record version {item.record.get('version')} does not keep where its {len(videos)} "
            "video(s) were in the rendered conversation (version 8 on): its prompt cannot be rebuilt; re-record it"
        )
    found = []
    for video in videos:
        if video.get("source") == "tool":  # its place is a later turn's context, never a prompt this rebuilds
            raise RecordError(
                f"{item.path}: video {video['id']} is a tool's answer (turn {video.get('turn')}); rescore rebuilds "
                "prompt videos only: not rescored"
            )
        if not video.get("times_s") or not video.get("width") or not video.get("height"):
            raise RecordError(f"{item.path}: video {video['id']} lacks its frames' times or size: cannot rebuild it")
        if video["width"] * video["height"] > DECODE_MAX_PIXELS:  # a frame the loop never shows: the record lies
            raise RecordError(
                f"{item.path}: video {video['id']}'s frames are {video['width']}x{video['height']} px, more than the "
                f"{DECODE_MAX_PIXELS} px a shown frame can have: not rebuilt"
            )
        found.append(RecordedVideo(tuple(video["times_s"]), video["width"], video["height"]))
    return found


def sample_tokens(
    record: dict,
    sample: dict,
    messages: list[dict],
    images: list[Image.Image],
    chat: dict,
    renderer: ChatRenderer,
    videos: Sequence[RecordedVideo] = (),
) -> tuple[list[int], list[int], bool]:
    """One training sample's prompt and response ids, and whether their counts are the record's: the conversation
    as the sample's context held it, its first ``images_left_out`` images as notes (``keep_last_images``); its
    videos are the prompt's, in every sample."""
    messages, images = in_context(sample, messages, images)
    assistant_at = [index for index, message in enumerate(messages) if message["role"] == "assistant"]
    turns = sample.get("turns") or []
    start = assistant_at[turns[0] - 1] if turns else (assistant_at[0] if assistant_at else len(messages))
    prompt = renderer.token_ids(messages[:start], _images_in(messages[:start], images), chat, True, videos)
    if not turns:  # the loop's stand-in for a masked trajectory: its prompt and one eos token
        response = [renderer.tokenizer.eos_token_id]
        return prompt, response, len(prompt) == sample["prompt_tokens"] and sample["response_tokens"] == 1
    if turns[-1] > len(assistant_at):
        raise RecordError(
            f"sample {sample.get('sample')} trains on turn {turns[-1]}, but the record's conversation holds "
            f"{len(assistant_at)} assistant messages: its response cannot be rebuilt"
        )
    end = assistant_at[turns[-1] - 1] + 1
    full = renderer.token_ids(messages[:end], _images_in(messages[:end], images), chat, False, videos)
    recorded = sample["response_tokens"]
    response = full[len(prompt) :][:recorded]
    matches = full[: len(prompt)] == prompt and len(prompt) == sample["prompt_tokens"] and len(response) == recorded
    return prompt, response, matches


def in_context(sample: dict, messages: list[dict], images: list) -> tuple[list[dict], list]:
    """The conversation and its images as the training ``sample``'s context held them (``image_window``)."""
    left_out = sample.get("images_left_out") or 0
    try:
        return windowed(messages, left_out), images[left_out:]
    except ValueError as error:
        raise RecordError(f"sample {sample.get('sample')}: images_left_out={left_out}, but {error}") from None


def _images_in(messages: list[dict], images: list[Image.Image]) -> list[Image.Image]:
    count = sum(
        part.get("type") == "image"
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
    )
    return images[:count]


def loop_fields(item: LoadedRecord, renderer: ChatRenderer) -> dict:
    """The loop's ``extra_fields`` (verl's ``tool_extra_fields``) from the record's ``stats``, which keeps them
    without their ``mm_tool/`` prefix, plus ``last_assistant_text``."""
    stats = item.record.get("stats") or {}
    fields = {key if key in STATS_KEYS else PREFIX + key: value for key, value in stats.items()}
    assistants = [message for message in item.record.get("messages") or [] if message.get("role") == "assistant"]
    fields[LAST_ASSISTANT_TEXT_KEY] = renderer.plain_text(assistants[-1]["text"]) if assistants else ""
    return fields


def row_columns(record: dict, reward_fn: str | None, judged: bool = False) -> dict:
    """The dataset row's columns the reward worker reads, from the record's ``sample``; ``judged``: the judge scores
    every record, so a row's own ``extra_info.reward_fn`` (which the manager would choose first) is set aside."""
    from verl_mm_tools.rewards.common import REWARD_FN_KEY

    sample = record.get("sample") or {}
    extra_info = dict(sample.get("extra_info") or {})
    if judged:
        extra_info.pop(REWARD_FN_KEY, None)
    elif reward_fn is not None and REWARD_FN_KEY in extra_info:
        extra_info[REWARD_FN_KEY] = reward_fn
    return {
        "data_source": sample.get("data_source"),
        "reward_model": {"ground_truth": sample.get("ground_truth")},
        "extra_info": extra_info,
        "index": sample.get("index"),
        "uid": sample.get("uid"),
    }


def num_turns(record: dict) -> int:
    """verl's ``num_turns`` of the trajectory: assistant turns + user turns (tool and environment answers) + 1."""
    if record.get("masked"):
        return 1
    messages = record.get("messages") or []
    assistant = sum(message.get("role") == "assistant" for message in messages)
    answers = {message.get("turn") for message in messages if message.get("role") != "assistant"} - {0, None}
    return assistant + len(answers) + 1


def _data_proto(prompt: list[int], response: list[int], row: dict, fields: dict, turns: int) -> DataProto:
    """The batch verl's ``AgentLoopWorker._compute_score`` builds for the trajectory's final sample (its code, minus
    M-RoPE): the one sample the v1 manager hands it (``adaptations.manager_tq``; several samples, right-padded as one
    sequence each, would give a manager the longest response's length for every one)."""
    import torch
    from tensordict import TensorDict
    from verl.protocol import DataProto

    input_ids = torch.tensor([prompt + response], dtype=torch.int64)
    batch = TensorDict(
        {
            "prompts": torch.tensor([prompt], dtype=torch.int64),
            "responses": torch.tensor([response], dtype=torch.int64),
            "attention_mask": torch.ones_like(input_ids),
            "input_ids": input_ids,
            "position_ids": torch.arange(input_ids.shape[1]).unsqueeze(0),
        },
        batch_size=1,
    )
    non_tensor = {key: object_array([value]) for key, value in row.items()}
    non_tensor.update(
        __num_turns__=np.array([turns]),
        tool_extra_fields=object_array([dict(fields)]),
        prompt_len=np.array([len(prompt)]),
        response_len=np.array([len(response)]),
    )
    return DataProto(batch=batch, non_tensor_batch=non_tensor)
