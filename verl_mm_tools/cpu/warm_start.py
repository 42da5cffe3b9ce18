"""A supervised warm start that teaches a random tiny model the OUTPUT FORMAT of the rotation task, not its answers.

A random-weight model never writes a parseable tool call, so RL has nothing to reinforce. Before training, we run
demonstrations through the real mm_tool loop (verl's ``AgentLoopWorker`` with a scripted server, so the tokens are
exactly those a rollout produces): turn 1 calls ``rotate`` with a random angle, the tool answers with an image,
turn 2 answers ``<answer>A</answer>`` with a RANDOM angle A. Fitting these teaches the format while leaving the
answer at chance. The loss is summed over tokens (every labelled token weighs the same, whatever its sample's
length): averaging per sample first made the short tool-call turn count too little.

The result is cached under the tiny-model cache, keyed by everything that determines it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from verl_mm_tools.data.rotation import ANGLES, QUESTION, rotation_samples

logger = logging.getLogger(__name__)

WARM_START_VERSION = 1
TOOL_DEGREES = (90, 180, 270)
# Demonstration pictures come from their own seed stream: their labels are random anyway.
DEMO_SEED_OFFSET = 7_000_001
MARKER = "warm_start.json"


@dataclass(frozen=True)
class WarmStartSpec:
    demonstrations: int = 64
    steps: int = 100
    # Batches of 4 ~500-token sequences run ~20x faster per sequence on CPU than batches of 8 (measured).
    batch_size: int = 4
    lr: float = 1e-2
    seed: int = 0


def warm_started_model(base_dir: str | Path, tools_yaml: str | Path, spec: WarmStartSpec = WarmStartSpec(),
                       cache_root: str | Path | None = None) -> Path:
    """The warm-started copy of ``base_dir`` for the tools in ``tools_yaml`` (built once, then reused)."""
    base_dir, tools_yaml = Path(base_dir), Path(tools_yaml)
    key = {"version": WARM_START_VERSION, "base": base_dir.name, "tools": tools_yaml.read_text(), **asdict(spec)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    target = Path(cache_root or base_dir.parent) / f"{base_dir.name}-warm-{digest}"
    if (target / MARKER).is_file():
        return target
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        shutil.copytree(base_dir, staging, dirs_exist_ok=True)
        report = warm_start(staging, tools_yaml, spec)
        (staging / MARKER).write_text(json.dumps({**key, **report}, indent=1))
        if not target.exists():
            staging.rename(target)  # atomic: a concurrent builder of the same key wins or loses whole
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def warm_start(model_dir: Path, tools_yaml: Path, spec: WarmStartSpec) -> dict:
    """Fit the model in ``model_dir`` to demonstrations, in place; returns timing and loss figures."""
    from transformers import AutoModelForImageTextToText

    started = time.perf_counter()
    examples = demonstrations(model_dir, tools_yaml, spec)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 10x faster than 2 threads on a busy 2-core machine (see cpu.config.THREAD_ENV)
    try:
        losses = fit(model, examples, spec)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(model_dir)
    report = {"seconds": round(time.perf_counter() - started, 2), "first_loss": losses[0], "last_loss": losses[-1]}
    logger.info("warm start: %s", report)
    return report


def demonstrations(model_dir: Path, tools_yaml: Path, spec: WarmStartSpec) -> list[dict[str, torch.Tensor]]:
    """Token-exact trajectories of the mm_tool loop with random tool angles and random answers."""
    from verl_mm_tools.agent_loop.harness import LocalRollout, image_prompt, tool_call_text, unpadded_row

    rng = random.Random(spec.seed)
    samples = rotation_samples(spec.demonstrations, spec.seed + DEMO_SEED_OFFSET)
    prompts = [image_prompt(QUESTION, [sample.image]) for sample in samples]

    def script(turn: int, prompt_ids, images) -> str:
        if turn == 0:
            return tool_call_text("rotate", degrees=rng.choice(TOOL_DEGREES))
        return f"<answer>{rng.choice(ANGLES)}</answer><|im_end|>"

    with tempfile.TemporaryDirectory() as workdir:
        output, _, worker = LocalRollout(model_dir, tools_yaml, workdir).run(script, prompts, max_turns=2)
    image_token = worker.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    examples = []
    for index in range(len(prompts)):
        row = unpadded_row(output, index)
        ids = row["prompt_ids"] + row["response_ids"]
        labels = [-100] * len(row["prompt_ids"]) + [
            token if trained else -100 for token, trained in zip(row["response_ids"], row["response_mask"], strict=True)
        ]
        inputs = output.non_tensor_batch["multi_modal_inputs"][index]
        examples.append({
            "input_ids": torch.tensor(ids),
            "labels": torch.tensor(labels),
            "mm_token_type_ids": (torch.tensor(ids) == image_token).long(),
            "pixel_values": inputs["pixel_values"],
            "image_grid_thw": inputs["image_grid_thw"],
        })
    return examples


def collate(examples: Sequence[dict[str, torch.Tensor]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch; images concatenated in example order (the order of their placeholders)."""
    width = max(len(example["input_ids"]) for example in examples)

    def pad(key: str, fill: int) -> torch.Tensor:
        return torch.stack([
            torch.nn.functional.pad(example[key], (0, width - len(example[key])), value=fill) for example in examples
        ])

    input_ids = pad("input_ids", pad_token_id)
    return {
        "input_ids": input_ids,
        "attention_mask": pad("input_ids", -1).ne(-1).long(),
        "labels": pad("labels", -100),
        "mm_token_type_ids": pad("mm_token_type_ids", 0),
        "pixel_values": torch.cat([example["pixel_values"] for example in examples]),
        "image_grid_thw": torch.cat([example["image_grid_thw"] for example in examples]),
    }


def fit(model, examples: list[dict[str, torch.Tensor]], spec: WarmStartSpec) -> list[float]:
    """AdamW on the summed token loss (normalised by the batch's labelled tokens); returns the loss per step."""
    generator = torch.Generator().manual_seed(spec.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    pad_token_id = model.config.get_text_config().pad_token_id or 0
    model.train()
    losses = []
    for _ in range(spec.steps):
        picks = torch.randperm(len(examples), generator=generator)[: spec.batch_size].tolist()
        loss = token_loss(model, collate([examples[pick] for pick in picks], pad_token_id))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(round(loss.item(), 4))
    model.eval()
    return losses


def token_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy over the labelled tokens of the batch. The vocabulary projection runs on those positions
    only: most of each sequence is the (unlabelled) prompt."""
    labels = batch.pop("labels")[:, 1:]
    hidden = model.model(**batch).last_hidden_state[:, :-1]
    trained = labels != -100
    logits = model.lm_head(hidden[trained]).float()
    return torch.nn.functional.cross_entropy(logits, labels[trained])
