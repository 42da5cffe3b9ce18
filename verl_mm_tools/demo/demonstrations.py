"""The warm start's demonstrations: token-exact trajectories of the real mm_tool loop (verl's ``AgentLoopWorker``
with a scripted server), each a tool call or none, then an answer. Their labels are uninformative by construction
(``uninformative_labels``, drawn apart for the demonstrations that call and those that do not), unless the task fits
another answer after a call (``AfterCall``) or the demonstrations are a task's ``sight`` ones (true answers)."""

from __future__ import annotations

import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from PIL import Image

from verl_mm_tools.compact_image import expanded_inputs
from verl_mm_tools.demo.format_tasks import TASKS, AfterCall, FormatTask, WarmStartSpec
from verl_mm_tools.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from verl.protocol import DataProto

    from verl_mm_tools.runtime.scripted_client import Script

# The processor's vision inputs a demonstration carries (those its images and videos gave)
VISION_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
# Demonstration pictures come from their own seed stream: their labels are random anyway.
DEMO_SEED_OFFSET = 7_000_001


SIGHT_SEED_OFFSET = 9_000_011


def demonstrations(model_dir: Path, tools_yaml: Path, spec: WarmStartSpec) -> list[dict[str, Any]]:
    """Token-exact trajectories of the mm_tool loop with random tool calls and random answers (and the task's
    ``sight`` demonstrations with their true answers)."""
    task = TASKS[spec.task]
    if task.video:
        from verl_mm_tools.demo.video_demonstrations import video_rollout

        return labelled_rows(*video_rollout(model_dir, tools_yaml, task, spec.demonstrations, spec.seed), task)
    pictures = task.pictures(spec.demonstrations, spec.seed + DEMO_SEED_OFFSET)
    examples = task_demonstrations(model_dir, tools_yaml, task, pictures, random.Random(spec.seed))
    if task.sight is None:
        return examples
    sight = TASKS[task.sight]
    seen = sight.pictures(spec.demonstrations, spec.seed + SIGHT_SEED_OFFSET)
    return examples + [
        {**example, "sight": True}
        for example in task_demonstrations(
            model_dir, tools_yaml, sight, seen, random.Random(spec.seed), true_labels=True
        )
    ]


def task_demonstrations(
    model_dir: Path,
    tools_yaml: Path,
    task: FormatTask,
    pictures: list[tuple[Image.Image, str]],
    rng: random.Random,
    *,
    true_labels: bool = False,
) -> list[dict[str, Any]]:
    """One demonstration per picture: a tool call (drawn from the task's) or none (``direct_share`` of each true
    answer's pictures), then an answer: uninformative labels, or the true answers with ``true_labels`` (the premise
    check, ``premise``)."""
    from verl_mm_tools.runtime.batch import image_prompt
    from verl_mm_tools.runtime.config import CLASSIC_HOOK
    from verl_mm_tools.runtime.rollout import LocalRollout

    script, calling = demonstration_script(task, pictures, rng, true_labels=true_labels)
    prompts = [image_prompt(task.question, [picture]) for picture, _ in pictures]
    with tempfile.TemporaryDirectory() as workdir:
        output, _, worker = LocalRollout(model_dir, tools_yaml, workdir).run(
            script, prompts, max_turns=2, extra=CLASSIC_HOOK
        )
    fits_any_answer = task.after_call == AfterCall.EITHER and not true_labels
    tokens = LabelTokens.of(worker.tokenizer, task, fits_any_answer)
    return [
        row_example(output, index, calling[index], task, tokens, true_labels=true_labels)
        for index in range(len(prompts))
    ]


def labelled_rows(output: DataProto, tokenizer: PreTrainedTokenizerBase, task: FormatTask) -> list[dict[str, Any]]:
    """Every row of ``output`` as a training example, labelled as the script answered (the video task's: its
    script decides at turn 0 whether a trajectory calls, so whether a row calls is read from its response)."""
    tokens = LabelTokens.of(tokenizer, task, fits_any_answer=False)
    call = tokenizer.convert_tokens_to_ids("<tool_call>")
    return [
        row_example(output, index, bool((responses == call).any()), task, tokens, true_labels=False)
        for index, responses in enumerate(output.batch["responses"])
    ]


@dataclass(frozen=True)
class LabelTokens:
    """The tokens a demonstration's inputs and labels are placed by."""

    image: int  # the image placeholder token
    video: int  # the video placeholder token
    answer_tag: list[int]  # "<answer>": the answer starts after its last occurrence
    fits_any_answer: bool  # whether the answer after a call is fitted to any answer (AfterCall.EITHER)
    choices: torch.Tensor  # the answers' tokens when it is (empty otherwise)

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase, task: FormatTask, fits_any_answer: bool) -> LabelTokens:
        empty = torch.tensor([], dtype=torch.long)
        return cls(
            image=cast(int, tokenizer.convert_tokens_to_ids("<|image_pad|>")),  # one token: one id
            video=cast(int, tokenizer.convert_tokens_to_ids("<|video_pad|>")),
            answer_tag=tokenizer.encode("<answer>"),
            fits_any_answer=fits_any_answer,
            choices=answer_tokens(tokenizer, task.answers) if fits_any_answer else empty,
        )


def row_example(
    output: DataProto, index: int, calls: bool, task: FormatTask, tokens: LabelTokens, *, true_labels: bool
) -> dict[str, Any]:
    """Row ``index`` of the rollout's output as a training example: its ids, labels on the trained response
    tokens, each labelled token's weight, its image inputs, and where its answer starts."""
    from verl_mm_tools.runtime.batch import unpadded_row

    row = unpadded_row(output, index)
    ids = row["prompt_ids"] + row["response_ids"]
    tag = tokens.answer_tag
    answer_at = max(at for at in range(len(tag), len(ids)) if ids[at - len(tag) : at] == tag)
    labels_of_row = [-100] * len(row["prompt_ids"]) + [
        token if trained else -100 for token, trained in zip(row["response_ids"], row["response_mask"], strict=True)
    ]
    any_answer = tokens.fits_any_answer and calls
    if any_answer:
        labels_of_row[answer_at] = -100
    weights = [float(label != -100) for label in labels_of_row]
    if task.after_call == AfterCall.TRUE and calls and not true_labels:
        weights[answer_at] = task.after_call_weight
    inputs = expanded_inputs(output.non_tensor_batch["multi_modal_inputs"][index])
    id_tensor = torch.tensor(ids)
    return {
        "input_ids": id_tensor,
        "labels": torch.tensor(labels_of_row),
        "weights": torch.tensor(weights),  # each labelled token's weight in the loss
        # transformers' token types: 1 image, 2 video
        "mm_token_type_ids": (id_tensor == tokens.image).long() + 2 * (id_tensor == tokens.video).long(),
        **{key: torch.as_tensor(inputs[key]) for key in VISION_KEYS if key in inputs},
        "answer_at": answer_at,  # where the answer's first token is
        "any_answer_at": answer_at if any_answer else -1,  # where any answer is fitted instead of the label
        "answer_choices": tokens.choices,  # the answers' tokens
        "calls": calls,  # whether it calls a tool first
        "sight": False,  # whether it is one of the task's ``sight`` demonstrations (true answers)
    }


def demonstration_script(
    task: FormatTask, pictures: list[tuple[Image.Image, str]], rng: random.Random, *, true_labels: bool = False
) -> tuple[Script, list[bool]]:
    """The scripted model's turns for the demonstrations of ``pictures`` (a ``ScriptedClient`` script) and which of them
    call a tool: a tool call (drawn from the task's) or none (``direct_share`` of each true answer's pictures), then
    an answer: uninformative labels, the true answers after a call with ``AfterCall.TRUE``, every true answer with
    ``true_labels``."""
    from verl_mm_tools.runtime.scripted_client import tool_call_text

    truths = [truth for _, truth in pictures]
    calling = calling_demonstrations(truths, task.direct_share, rng)
    labels = list(truths) if true_labels else labels_per_group(truths, calling, task.answers, rng)
    if task.after_call == AfterCall.TRUE:
        labels = [truth if calls else label for truth, calls, label in zip(truths, calling, labels, strict=True)]
    # The server sees trajectories in any order: the prompt picture's pixels tell which demonstration it serves.
    index_of = {picture.tobytes(): index for index, (picture, _) in enumerate(pictures)}

    def script(turn: int, prompt_ids: list[int], images: list[Image.Image]) -> str:
        index = index_of[images[0].tobytes()]
        if turn == 0 and calling[index]:
            name, arguments = rng.choice(task.calls)
            return tool_call_text(name, **arguments)
        return f"<answer>{labels[index]}</answer><|im_end|>"

    return script, calling


def answer_tokens(tokenizer: PreTrainedTokenizerBase, answers: Sequence[str]) -> torch.Tensor:
    """Each answer's one token (a fit to "any answer" needs answers of one token each)."""
    tokens = [tokenizer.encode(answer) for answer in answers]
    if any(len(ids) != 1 for ids in tokens):
        raise ConfigError(
            f"every answer must be one token of the tokenizer to fit 'any answer'; got "
            f"{dict(zip(answers, tokens, strict=True))}: fit another answer after a call (AfterCall)"
        )
    return torch.tensor([ids[0] for ids in tokens])


def calling_demonstrations(truths: Sequence[str], direct_share: float, rng: random.Random) -> list[bool]:
    """Which demonstrations call the tool: ``1 - direct_share`` of each true answer's (rounded), drawn at random, so
    whether a demonstration calls tells nothing about its answer."""
    if direct_share in (0.0, 1.0):  # no draw: the rng then gives the labels and calls it gave before this option
        return [direct_share == 0.0] * len(truths)
    calling = [False] * len(truths)
    for truth in dict.fromkeys(truths):
        indices = [index for index, value in enumerate(truths) if value == truth]
        rng.shuffle(indices)
        for index in indices[: round(len(indices) * (1 - direct_share))]:
            calling[index] = True
    return calling


def labels_per_group(
    truths: Sequence[str], calling: Sequence[bool], answers: Sequence[str], rng: random.Random
) -> list[str]:
    """``uninformative_labels`` drawn apart for the demonstrations that call and those that do not: neither group's
    labels tell anything about its pictures."""
    labels = [""] * len(truths)
    for group in (True, False):
        indices = [index for index, calls in enumerate(calling) if calls == group]
        for index, label in zip(indices, uninformative_labels([truths[i] for i in indices], answers, rng), strict=True):
            labels[index] = label
    return labels


def uninformative_labels(truths: Sequence[str], answers: Sequence[str], rng: random.Random) -> list[str]:
    """A random label per demonstration such that the pictures of each true answer get every answer equally often
    (up to one): the labels then tell nothing about the pictures. Labels drawn independently per picture correlate
    with the truth by chance (~1/sqrt(n)), and the model learned that correlation: 75 % of its first color answers
    were the wrong color (measured)."""
    labels = [""] * len(truths)
    for truth in dict.fromkeys(truths):
        indices = [index for index, value in enumerate(truths) if value == truth]
        drawn = [answers[position % len(answers)] for position in range(len(indices))]
        rng.shuffle(drawn)
        for index, label in zip(indices, drawn, strict=True):
            labels[index] = label
    return labels
