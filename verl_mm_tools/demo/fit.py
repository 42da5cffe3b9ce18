"""The warm start's fit: AdamW on the demonstrations' summed token loss (``token_loss``), in balanced batches
(``balanced_picks``), after an optional first fit on the answers after a call (``read_after_calls``); and the answer
shares it ends with (``answer_shares``)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import torch

from verl_mm_tools.demo.demonstrations import VISION_KEYS
from verl_mm_tools.demo.format_tasks import TASKS, WarmStartSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class FitSettings(Protocol):
    """What a fit takes: its steps, learning rate, batch size and seed (a ``WarmStartSpec``, say)."""

    @property
    def steps(self) -> int: ...
    @property
    def lr(self) -> float: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def seed(self) -> int: ...


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread for a fit: 10x faster than 2 threads on a busy 2-core machine (cpu.overrides.THREAD_ENV)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


READING_LR = 3e-3  # the premise's rate: at 1e-2 its fit answered at chance after 300 steps


def read_after_calls(model: PreTrainedModel, examples: list[dict], spec: WarmStartSpec) -> list[float]:
    """The task's ``reading_steps`` fit on the answers after a call (their labels, answer tokens only); returns the
    loss per step (none without reading steps)."""
    task = TASKS[spec.task]
    if not task.reading_steps:
        return []
    callers = [answer_only(example) for example in examples if example["calls"] and not example["sight"]]
    return fit(model, callers, replace(spec, steps=task.reading_steps, lr=READING_LR))


def answer_only(example: dict) -> dict:
    """The demonstration with its labels on the answer's tokens only."""
    labels = example["labels"].clone()
    labels[: example["answer_at"]] = -100
    return {**example, "labels": labels}


def collate(examples: Sequence[dict[str, torch.Tensor]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch; images concatenated in example order (the order of their placeholders)."""
    width = max(len(example["input_ids"]) for example in examples)

    def pad(key: str, fill: int) -> torch.Tensor:
        return torch.stack(
            [torch.nn.functional.pad(example[key], (0, width - len(example[key])), value=fill) for example in examples]
        )

    input_ids = pad("input_ids", pad_token_id)
    return {
        "input_ids": input_ids,
        "attention_mask": pad("input_ids", -1).ne(-1).long(),
        "labels": pad("labels", -100),
        "weights": pad("weights", 0),
        "mm_token_type_ids": pad("mm_token_type_ids", 0),
        **vision_inputs(examples),
        "any_answer_at": torch.tensor([example.get("any_answer_at", -1) for example in examples]),
        "answer_choices": next(
            (example["answer_choices"] for example in examples if example.get("any_answer_at", -1) >= 0),
            torch.tensor([], dtype=torch.long),
        ),
    }


def vision_inputs(examples: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Each vision input the examples carry, concatenated in example order (the order of their placeholders)."""
    return {
        key: torch.cat([example[key] for example in examples if key in example])
        for key in VISION_KEYS
        if any(key in example for example in examples)
    }


def fit(model: PreTrainedModel, examples: list[dict[str, torch.Tensor]], spec: FitSettings) -> list[float]:
    """AdamW on the summed token loss (normalised by the batch's labelled tokens); returns the loss per step.

    The learning rate decays to 0 (cosine): the answer's prior then settles near the labels' overall mix. At a
    constant rate the last few batches' random labels set it (measured: 90 % "red" for the color task, and RL could
    not pull it back: groups whose four rollouts all say "red" have no advantage). Where some demonstrations call a
    tool and some do not, each batch holds as many of each (``balanced_picks``): with batches drawn at random, the
    zoom task's model called in a third of its first turns, not a half.
    """
    generator = torch.Generator().manual_seed(spec.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, spec.steps) / spec.steps))
    )
    pad_token_id = model.config.get_text_config().pad_token_id or 0
    model.train()
    losses = []
    for _ in range(spec.steps):
        picks = balanced_picks(examples, spec.batch_size, generator)
        loss = token_loss(model, collate([examples[pick] for pick in picks], pad_token_id))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(round(loss.item(), 4))
    model.eval()
    return losses


def answer_shares(
    model: PreTrainedModel, examples: list[dict], model_dir: Path, answers: Sequence[str]
) -> dict[str, float]:
    """Mean probability of each answer choice (its first token) where the demonstrations answer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    first_tokens = [tokenizer.encode(answer)[0] for answer in answers]
    totals = cast(torch.Tensor, sum(answer_probabilities(model, example, first_tokens) for example in examples))
    return {answer: round(float(total) / len(examples), 4) for answer, total in zip(answers, totals, strict=True)}


def balanced_picks(examples: list[dict], batch_size: int, generator: torch.Generator) -> list[int]:
    """A random batch; where demonstrations differ in whether they call a tool, half of it from each kind; ``sight``
    demonstrations come on top, half a batch of them, so that they do not change how often the task's calls."""
    own = [index for index, example in enumerate(examples) if not example.get("sight")]
    sight = [index for index, example in enumerate(examples) if example.get("sight")]
    kinds = [[index for index in own if examples[index].get("calls") == calls] for calls in (True, False)]
    picks = _picks_from(kinds if all(kinds) else [own], batch_size, generator)
    return picks + (_picks_from([sight], batch_size // 2, generator) if sight else [])


def _picks_from(kinds: list[list[int]], count: int, generator: torch.Generator) -> list[int]:
    """``count`` distinct indices drawn at random, as evenly from each of ``kinds`` as ``count`` allows."""
    shares = [count // len(kinds) + (position < count % len(kinds)) for position in range(len(kinds))]
    return [
        kind[pick]
        for kind, share in zip(kinds, shares, strict=True)
        for pick in torch.randperm(len(kind), generator=generator)[:share].tolist()
    ]


@torch.no_grad()
def answer_probabilities(model: PreTrainedModel, example: dict, tokens: Sequence[int]) -> torch.Tensor:
    """The model's probabilities of ``tokens`` where the example's answer starts."""
    batch = model_inputs(collate([example], model.config.get_text_config().pad_token_id or 0))
    hidden = model.model(**batch).last_hidden_state[0, example["answer_at"] - 1]
    return model.lm_head(hidden).float().softmax(-1)[list(tokens)]


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        key: value
        for key, value in batch.items()
        if key not in ("labels", "weights", "any_answer_at", "answer_choices")
    }


def token_loss(model: PreTrainedModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Weighted mean loss over the labelled tokens of the batch (``weights``): cross-entropy; -log(sum of the
    answers' probabilities) where any answer is fitted (``any_answer_at``); and, where there are such answers, one
    balance term: the KL divergence from even shares to their mean shares of the answers (each answer's probability
    among the answers, averaged over those rows). The vocabulary projection runs on those positions only: most of
    each sequence is the (unlabelled) prompt."""
    hidden = model.model(**model_inputs(batch)).last_hidden_state
    labels = batch["labels"][:, 1:]
    trained = labels != -100
    weights = batch["weights"][:, 1:][trained]
    losses = torch.nn.functional.cross_entropy(
        model.lm_head(hidden[:, :-1][trained]).float(), labels[trained], reduction="none"
    )
    rows = (batch["any_answer_at"] >= 0).nonzero().flatten()
    if len(rows):
        logits = model.lm_head(hidden[rows, batch["any_answer_at"][rows] - 1]).float()
        answers = logits[:, batch["answer_choices"]]
        any_answer = logits.logsumexp(-1) - answers.logsumexp(-1)
        shares = answers.softmax(-1).mean(0)
        balance = -shares.log().mean() - math.log(len(shares))
        losses = torch.cat([losses, any_answer, balance[None]])
        weights = torch.cat([weights, torch.ones(len(rows) + 1)])
    return (losses * weights).sum() / weights.sum()
