"""A supervised warm start that teaches a random tiny model the OUTPUT FORMAT of a demo task, not its answers.

A random-weight model never writes a parseable tool call, so RL has nothing to reinforce. Before training, we run
demonstrations through the real mm_tool loop (verl's ``AgentLoopWorker`` with a scripted server, so the tokens are
exactly those a rollout produces): turn 1 calls a tool (``rotate`` with a random angle; ``zoom_in`` on the centre
box), the tool answers with an image, turn 2 answers ``<answer>A</answer>`` with a RANDOM answer A among the task's
choices (``TASKS``; the color task answers in turn 1, the zoom tasks in turn 1 in half their demonstrations). The
labels are uninformative by construction (``uninformative_labels``, drawn apart for the demonstrations that call and
those that do not): fitting them teaches the format and leaves the answer at chance. After a call, a task may fit
another answer instead (``AfterCall``): learn_zoom fits either answer, balanced over each batch (a random label there
taught it to ignore the zoomed image); the main job's ``zoom`` task fits the true answer, a cold start that reads the
zoomed image but calls no more often than it answers at once. The loss is summed over tokens (every labelled token
weighs the same, whatever its sample's length, unless its task weighs it): averaging per sample first made the short
tool-call turn count too little.

The result is cached under the tiny-model cache, keyed by everything that determines it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path

import torch
from PIL import Image

from verl_mm_tools.data import color, rotation, zoom_color
from verl_mm_tools.data.rotation import ANGLES
from verl_mm_tools.errors import ConfigError

logger = logging.getLogger(__name__)

WARM_START_VERSION = 5
TOOL_DEGREES = (90, 180, 270)
# Demonstration pictures come from their own seed stream: their labels are random anyway.
DEMO_SEED_OFFSET = 7_000_001
SIGHT_SEED_OFFSET = 9_000_011
MARKER = "warm_start.json"
READING_LR = 3e-3  # the premise's rate: at 1e-2 its fit answered at chance after 300 steps


class AfterCall(str, Enum):
    """What the answer after a tool's image is fitted to."""

    RANDOM = "random label"  # uninformative, as the direct answers
    # Any of the answers: the loss -log(sum of the answers' probabilities), plus a term that keeps the answers' mean
    # over the batch even (each answer still free to follow the picture)
    EITHER = "either answer, balanced over the batch"
    TRUE = "the true answer"  # a cold start that reads the tool's image


ToolCall = tuple[str, dict]  # a tool's name and its arguments


@dataclass(frozen=True)
class FormatTask:
    """What the demonstrations of a task look like: its question, its answer choices, its pictures and its tool call."""

    question: str
    answers: tuple[str, ...]
    pictures: Callable[[int, int], list[tuple[Image.Image, str]]]  # (count, seed) -> (picture, true answer)
    calls: tuple[ToolCall, ...] = tuple(("rotate", {"degrees": degrees}) for degrees in TOOL_DEGREES)  # one drawn
    # The share of demonstrations that answer at once, without a call (the same share of each true answer's)
    direct_share: float = 0.0
    # Another task whose demonstrations join these with their TRUE answers. Fitted to a format that never depends on
    # the picture, the tiny model stops attending to its pictures and then cannot learn to read them (measured in
    # docs/experiments/learn_zoom.md); real VLMs come pretrained to look, and this keeps the tiny one looking.
    sight: str | None = None
    # What the answer after a tool's image is fitted to. Random labels there teach the answer after a tool's image to
    # ignore that image, and RL then had to undo it: reading the zoomed box started in some runs and not in others;
    # with EITHER but without its balance term one seed's answer after a call leaned 80 % to one answer and never
    # read (docs/experiments/learn_zoom.md). Left out of the loss entirely, the tiny model wrote no answer there.
    after_call: AfterCall = AfterCall.RANDOM
    # The loss weight of the true answer after a call (AfterCall.TRUE) against each other labelled token's 1: it is
    # one token of the ~60 a calling demonstration labels. Weighted 1, the zoom_read fit read the zoomed box after
    # 600 steps (p(true answer) 0.97) and not after 300 (0.50); weighted 10, not after 200; weighted 30, after 200
    # on seeds 0, 1 and 2 (0.996-1.0).
    after_call_weight: float = 1.0
    # Steps of a first fit on the calling demonstrations' answers alone (answer tokens only, lr READING_LR), before
    # the format fit: the premise's fit (``demo.premise``), which reads the zoomed box from the untrained model within
    # 100 steps. Without it, whether the format fit ever read depended on the seed (seed 1 at 450 steps: p(true
    # answer) 0.50 after a zoom; seeds 0 and 2: 1.00).
    reading_steps: int = 0

    def __post_init__(self):
        if not self.calls and self.direct_share != 1.0:
            raise ConfigError(
                f"a format task without tool calls answers at once: direct_share must be 1.0, got {self.direct_share}"
            )


TASKS = {
    "rotation": FormatTask(
        rotation.QUESTION,
        tuple(str(angle) for angle in ANGLES),
        lambda count, seed: [(sample.image, str(sample.angle)) for sample in rotation.rotation_samples(count, seed)],
    ),
    # Answers at once (the rotate tool is still offered). With a rotate call first, the call itself flipped on and
    # off between steps at the learning rates that teach the answer (measured with verl's trainer, labels drawn
    # independently then: calls per trajectory 1.0 -> 0.0 within 17 steps at 3e-3, no learning in 35 at 1e-3).
    "color": FormatTask(
        color.QUESTION,
        tuple(color.COLORS),
        lambda count, seed: [(sample.image, sample.label) for sample in color.color_samples(count, seed)],
        calls=(),
        direct_share=1.0,
    ),
    # Half answer at once, half zoom in on the centre box first: the first policy calls about half the time, and
    # nothing tells it when calling pays.
    "zoom_color": FormatTask(
        zoom_color.QUESTION,
        tuple(zoom_color.PATTERNS),
        lambda count, seed: [(sample.image, sample.label) for sample in zoom_color.zoom_color_samples(count, seed)],
        calls=(("zoom_in", zoom_color.BOX_ARGUMENTS),),
        direct_share=0.5,
        sight="color",
        after_call=AfterCall.EITHER,
    ),
}
# The main job's cold start: as zoom_color, but the answer after the zoom is the true one. It reads the zoomed box
# and still calls in half its first turns: RL learns when calling pays. No sight pictures: the true answers after a
# zoom keep it looking at its pictures, and a step without them costs about a third less.
TASKS["zoom_read"] = replace(
    TASKS["zoom_color"], sight=None, after_call=AfterCall.TRUE, after_call_weight=30.0, reading_steps=100
)
# The same answers after a rotate call by 90 degrees: every trajectory holds a tool call and the tool's image.
TASKS["color_tool"] = replace(TASKS["color"], calls=(("rotate", {"degrees": 90}),), direct_share=0.0)


@dataclass(frozen=True)
class WarmStartSpec:
    task: str = "rotation"
    demonstrations: int = 64
    steps: int = 200
    # Batches of 4 ~500-token sequences run ~20x faster per sequence on CPU than batches of 8 (measured).
    batch_size: int = 4
    lr: float = 1e-2
    seed: int = 0

    def __post_init__(self):
        if self.task not in TASKS:
            raise ConfigError(f"unknown warm-start task {self.task!r}; choose one of {sorted(TASKS)}")


def warm_started_model(
    base_dir: str | Path,
    tools_yaml: str | Path,
    spec: WarmStartSpec = WarmStartSpec(),
    cache_root: str | Path | None = None,
) -> Path:
    """The warm-started copy of ``base_dir`` for the tools in ``tools_yaml`` (built once, then reused)."""
    from verl_mm_tools.remote.tool import without_remote

    base_dir = Path(base_dir)
    tools_text = without_remote(Path(tools_yaml).read_text())  # demonstrations run the tools here, not on Ray
    task = TASKS[spec.task]
    key = {
        "version": WARM_START_VERSION,
        "base": base_dir.name,
        "tools": tools_text,
        **asdict(spec),
        "question": task.question,
        "answers": task.answers,
        "calls": task.calls,
        "direct_share": task.direct_share,
        "sight": task.sight,
        "after_call": task.after_call.value,
        "after_call_weight": task.after_call_weight,
        "reading_steps": task.reading_steps,
    }

    def build(scratch: Path) -> tuple[Path, dict]:
        model, local_tools = scratch / "model", scratch / "tools.yaml"
        shutil.copytree(base_dir, model)
        local_tools.write_text(tools_text)
        return model, warm_start(model, local_tools, spec)

    return cached_model(base_dir, "warm", key, MARKER, build, cache_root)


def cached_model(
    base_dir: Path,
    kind: str,
    key: dict,
    marker: str,
    build: Callable[[Path], tuple[Path, dict]],
    cache_root: str | Path | None = None,
) -> Path:
    """``<cache_root>/<base name>-<kind>-<digest of key>``, built once by ``build(scratch)`` (the model folder it
    made inside ``scratch`` and a report, written with ``key`` to ``marker``), then reused."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    target = Path(cache_root or base_dir.parent) / f"{base_dir.name}-{kind}-{digest}"
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{target.name}-", dir=target.parent) as scratch:
        model, report = build(Path(scratch))
        (model / marker).write_text(json.dumps({**key, **report}, indent=1))
        if not target.exists():
            model.rename(target)  # atomic: a concurrent builder of the same key wins or loses whole
    return target


def warm_start(model_dir: Path, tools_yaml: Path, spec: WarmStartSpec) -> dict:
    """Fit the model in ``model_dir`` to demonstrations, in place; returns timing and loss figures."""
    from transformers import AutoModelForImageTextToText

    started = time.perf_counter()
    examples = demonstrations(model_dir, tools_yaml, spec)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 10x faster than 2 threads on a busy 2-core machine (see cpu.overrides.THREAD_ENV)
    try:
        reading = read_after_calls(model, examples, spec)
        losses = fit(model, examples, spec)
        own = [example for example in examples if not example["sight"]]
        shares = answer_shares(model, own, model_dir, TASKS[spec.task].answers)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(model_dir)
    report = {
        "seconds": round(time.perf_counter() - started, 2),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "reading_losses": reading[:1] + reading[-1:],
        "answer_shares": shares,
    }
    logger.info("warm start: %s", report)
    return report


def read_after_calls(model, examples: list[dict], spec: WarmStartSpec) -> list[float]:
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


def demonstrations(model_dir: Path, tools_yaml: Path, spec: WarmStartSpec) -> list[dict[str, torch.Tensor]]:
    """Token-exact trajectories of the mm_tool loop with random tool calls and random answers (and the task's
    ``sight`` demonstrations with their true answers)."""
    task = TASKS[spec.task]
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
) -> list[dict[str, torch.Tensor]]:
    """One demonstration per picture: a tool call (drawn from the task's) or none (``direct_share`` of each true
    answer's pictures), then an answer: uninformative labels, or the true answers with ``true_labels`` (the premise
    check, ``premise``)."""
    from verl_mm_tools.agent_loop.harness import CLASSIC_HOOK, LocalRollout, image_prompt, unpadded_row

    script, calling = demonstration_script(task, pictures, rng, true_labels=true_labels)
    prompts = [image_prompt(task.question, [picture]) for picture, _ in pictures]
    with tempfile.TemporaryDirectory() as workdir:
        output, _, worker = LocalRollout(model_dir, tools_yaml, workdir).run(
            script, prompts, max_turns=2, extra=CLASSIC_HOOK
        )
    image_token = worker.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    answer_tag = worker.tokenizer.encode("<answer>")
    fits_any_answer = task.after_call == AfterCall.EITHER and not true_labels
    choices = answer_tokens(worker.tokenizer, task.answers) if fits_any_answer else torch.tensor([], dtype=torch.long)
    examples = []
    for index in range(len(prompts)):
        row = unpadded_row(output, index)
        ids = row["prompt_ids"] + row["response_ids"]
        answer_at = max(at for at in range(len(answer_tag), len(ids)) if ids[at - len(answer_tag) : at] == answer_tag)
        labels_of_row = [-100] * len(row["prompt_ids"]) + [
            token if trained else -100 for token, trained in zip(row["response_ids"], row["response_mask"], strict=True)
        ]
        any_answer = fits_any_answer and calling[index]
        if any_answer:
            labels_of_row[answer_at] = -100
        weights = [float(label != -100) for label in labels_of_row]
        if task.after_call == AfterCall.TRUE and calling[index] and not true_labels:
            weights[answer_at] = task.after_call_weight
        inputs = output.non_tensor_batch["multi_modal_inputs"][index]
        examples.append(
            {
                "input_ids": torch.tensor(ids),
                "labels": torch.tensor(labels_of_row),
                "weights": torch.tensor(weights),  # each labelled token's weight in the loss
                "mm_token_type_ids": (torch.tensor(ids) == image_token).long(),
                "pixel_values": inputs["pixel_values"],
                "image_grid_thw": inputs["image_grid_thw"],
                "answer_at": answer_at,  # where the answer's first token is
                "any_answer_at": answer_at if any_answer else -1,  # where any answer is fitted instead of the label
                "answer_choices": choices,  # the answers' tokens
                "calls": calling[index],  # whether it calls a tool first
                "sight": False,  # whether it is one of the task's ``sight`` demonstrations (true answers)
            }
        )
    return examples


def demonstration_script(
    task: FormatTask, pictures: list[tuple[Image.Image, str]], rng: random.Random, *, true_labels: bool = False
) -> tuple[Callable, list[bool]]:
    """The scripted model's turns for the demonstrations of ``pictures`` (a ScriptedServer script) and which of them
    call a tool: a tool call (drawn from the task's) or none (``direct_share`` of each true answer's pictures), then
    an answer: uninformative labels, the true answers after a call with ``AfterCall.TRUE``, every true answer with
    ``true_labels``."""
    from verl_mm_tools.agent_loop.harness import tool_call_text

    truths = [truth for _, truth in pictures]
    calling = calling_demonstrations(truths, task.direct_share, rng)
    labels = list(truths) if true_labels else labels_per_group(truths, calling, task.answers, rng)
    if task.after_call == AfterCall.TRUE:
        labels = [truth if calls else label for truth, calls, label in zip(truths, calling, labels, strict=True)]
    # The server sees trajectories in any order: the prompt picture's pixels tell which demonstration it serves.
    index_of = {picture.tobytes(): index for index, (picture, _) in enumerate(pictures)}

    def script(turn: int, prompt_ids, images) -> str:
        index = index_of[images[0].tobytes()]
        if turn == 0 and calling[index]:
            name, arguments = rng.choice(task.calls)
            return tool_call_text(name, **arguments)
        return f"<answer>{labels[index]}</answer><|im_end|>"

    return script, calling


def answer_tokens(tokenizer, answers: Sequence[str]) -> torch.Tensor:
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
        "pixel_values": torch.cat([example["pixel_values"] for example in examples]),
        "image_grid_thw": torch.cat([example["image_grid_thw"] for example in examples]),
        "any_answer_at": torch.tensor([example.get("any_answer_at", -1) for example in examples]),
        "answer_choices": next(
            (example["answer_choices"] for example in examples if example.get("any_answer_at", -1) >= 0),
            torch.tensor([], dtype=torch.long),
        ),
    }


def fit(model, examples: list[dict[str, torch.Tensor]], spec: WarmStartSpec) -> list[float]:
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


def answer_shares(model, examples: list[dict], model_dir: Path, answers: Sequence[str]) -> dict[str, float]:
    """Mean probability of each answer choice (its first token) where the demonstrations answer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    first_tokens = [tokenizer.encode(answer)[0] for answer in answers]
    totals = sum(answer_probabilities(model, example, first_tokens) for example in examples)
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
def answer_probabilities(model, example: dict, tokens: Sequence[int]) -> torch.Tensor:
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


def token_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
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
