"""A transformers model behind verl's token-in/token-out interface: generate and score with images, on CPU.

Two traps it handles (both seen with transformers 5 and Qwen-VL):
- M-RoPE is applied only when ``mm_token_type_ids`` is passed; without it rollout and trainer log-probs differ by up
  to 0.19. We always pass it.
- A degenerate policy samples vision placeholder tokens, which crashes verl's postprocess. We never sample them (they
  are suppressed), while log-probs still come from the model's logits, as the trainer recomputes them.

Log-probs follow verl's ``rollout.logprobs_mode`` as vLLM computes them: ``processed_logprobs`` (verl's default) are
those of the distribution sampled from, after temperature, top-k and top-p (a token's probability renormalized over
the nucleus); ``raw_logprobs`` those of the full softmax of the logits. With ``top_p`` < 1 the two differ, and so does
the rollout's log-prob from the trainer's (verl's ``training/rollout_probs_diff_*``), on any engine.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from PIL import Image

from verl_mm_tools.tokens import placeholder_token_ids, stop_ids, vision_token_ids

logger = logging.getLogger(__name__)

PROCESSED_LOGPROBS, RAW_LOGPROBS = "processed_logprobs", "raw_logprobs"
LOGPROBS_MODES = (PROCESSED_LOGPROBS, RAW_LOGPROBS)  # verl's rollout.logprobs_mode values that are log-probs


# where each image's pixel values sit: Qwen-VL's and GLM-V's patch grid per image, Gemma 4's position per patch
IMAGE_LAYOUT_KEYS = ("image_grid_thw", "image_position_ids")


class HFVisionLM:
    """A VLM checkpoint in transformers (Qwen-VL, Qwen3.5, GLM-V, Gemma 4), answering token-level generate/score
    requests."""

    def __init__(self, model_path: str, *, dtype: torch.dtype = torch.float32):
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.processor = AutoProcessor.from_pretrained(model_path)
        self.tokenizer = self.processor.tokenizer
        self.model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=dtype).eval()
        self.image_token_id, self.video_token_id = placeholder_token_ids(self.processor, self.tokenizer)
        self.forbidden_token_ids = sorted(vision_token_ids(self.tokenizer))
        self.eos_token_ids = sorted(stop_ids(self.model.generation_config.eos_token_id, self.tokenizer))

    def model_inputs(self, token_ids: Sequence[int], images: Sequence[Image.Image] = ()) -> dict[str, torch.Tensor]:
        """Forward inputs for token ids whose image placeholders are already expanded."""
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long)
        inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
        if images:
            features = self.processor.image_processor(images=list(images), return_tensors="pt")
            inputs["pixel_values"] = features["pixel_values"].to(self.model.dtype)
            inputs.update({key: features[key] for key in IMAGE_LAYOUT_KEYS if key in features})
        token_types = torch.zeros_like(input_ids)
        if self.image_token_id is not None:
            token_types[input_ids == self.image_token_id] = 1
        if self.video_token_id is not None:
            token_types[input_ids == self.video_token_id] = 2
        inputs["mm_token_type_ids"] = token_types
        return inputs

    @torch.no_grad()
    def score(
        self,
        prompt_ids: Sequence[int],
        continuation: Sequence[int],
        images: Sequence[Image.Image] = (),
        temperature: float = 1.0,
    ) -> list[float]:
        """Teacher-forced log-probs of ``continuation`` after ``prompt_ids``."""
        if not continuation:
            return []
        logits = self.model(**self.model_inputs([*prompt_ids, *continuation], images)).logits[0]
        logits = logits[len(prompt_ids) - 1 : -1].float() / _positive(temperature)
        targets = torch.tensor(list(continuation)).unsqueeze(-1)
        return torch.log_softmax(logits, dim=-1).gather(-1, targets).squeeze(-1).tolist()

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Sequence[int],
        images: Sequence[Image.Image] = (),
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        seed: int | None = None,
        logprobs_mode: str = PROCESSED_LOGPROBS,
        inputs: Mapping[str, Any] | None = None,
    ) -> tuple[list[int], list[float]]:
        """Sample (greedy when temperature is 0) up to ``max_new_tokens``; returns (token ids, log-probs).
        ``inputs``: the forward's inputs made elsewhere, in the place of ``model_inputs(prompt_ids, images)`` (eval's
        checkpoint engine passes the trainer's for a prompt with videos: their position ids included)."""
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            (result,) = self.generate_from(
                self.model_inputs(prompt_ids, images) if inputs is None else inputs,
                max_new_tokens=[max_new_tokens],
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                logprobs_mode=logprobs_mode,
            )
        return result

    def batch_inputs(self, requests: Sequence[tuple[Sequence[int], Sequence[Image.Image]]]) -> dict[str, torch.Tensor]:
        """Forward inputs for several requests, left-padded; their images concatenated in request order."""
        singles = [self.model_inputs(ids, images) for ids, images in requests]
        if len(singles) == 1:
            return singles[0]
        width = max(single["input_ids"].shape[1] for single in singles)
        batch = {}
        for key, fill in (("input_ids", self.tokenizer.pad_token_id), ("attention_mask", 0), ("mm_token_type_ids", 0)):
            batch[key] = torch.cat([_left_pad(single[key], width, fill) for single in singles])
        with_images = [single for single in singles if "pixel_values" in single]
        for key in ("pixel_values", *IMAGE_LAYOUT_KEYS):
            if with_images and key in with_images[0]:
                batch[key] = torch.cat([single[key] for single in with_images])
        return batch

    @torch.no_grad()
    def generate_batch(
        self,
        requests: Sequence[tuple[Sequence[int], Sequence[Image.Image]]],
        *,
        max_new_tokens: Sequence[int],
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        logprobs_mode: str = PROCESSED_LOGPROBS,
        stop_token_ids: Sequence[int] = (),
    ) -> list[tuple[list[int], list[float]]]:
        """``generate`` for several (prompt ids, images) requests at once: one (token ids, log-probs) per request,
        each cut at its own ``max_new_tokens`` and after its first end-of-turn token or ``stop_token_ids`` token.
        Sampling per step is independent across rows, so cutting a longer sample is the same as stopping there."""
        return self.generate_from(
            self.batch_inputs(requests),
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            logprobs_mode=logprobs_mode,
            stop_token_ids=stop_token_ids,
        )

    @torch.no_grad()
    def generate_from(
        self,
        inputs: Mapping[str, Any],
        *,
        max_new_tokens: Sequence[int],
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        logprobs_mode: str = PROCESSED_LOGPROBS,
        stop_token_ids: Sequence[int] = (),
    ) -> list[tuple[list[int], list[float]]]:
        """``generate_batch`` from the forward's inputs of its rows (``batch_inputs``'s, or ones with position ids:
        transformers' generate then continues them, each new token one past the last)."""
        stops = sorted({*self.eos_token_ids, *stop_token_ids})
        sampling = (
            {"do_sample": False}
            if temperature <= 0
            else {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": top_k if top_k > 0 else 0}
        )
        out = self.model.generate(
            **inputs,
            max_new_tokens=max(max_new_tokens),
            suppress_tokens=self.forbidden_token_ids,
            eos_token_id=stops,
            pad_token_id=self.tokenizer.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
            **sampling,
        )
        generated = out.sequences[:, inputs["input_ids"].shape[1] :]
        # Log-probs from the model's logits (before suppression), as the trainer recomputes them.
        scaled = torch.stack(out.logits, dim=1).float() / _positive(temperature)
        if logprobs_mode == PROCESSED_LOGPROBS and temperature > 0:
            scaled = nucleus(scaled, top_p, top_k)
        log_probs = torch.log_softmax(scaled, dim=-1).gather(-1, generated.unsqueeze(-1)).squeeze(-1)
        return [
            _cut(generated[row].tolist(), log_probs[row].tolist(), limit, stops)
            for row, limit in enumerate(max_new_tokens)
        ]

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy trainer weights (verl's HF-named full tensors) into the model; returns how many were loaded."""
        state = self.model.state_dict()
        unknown, loaded = [], 0
        for name, tensor in named_tensors:
            target = state.get(name)
            if target is None:
                target = fused_expert_slot(state, name)
            if target is None or target.shape != tensor.shape:
                unknown.append(f"{name} {tuple(tensor.shape)}")
                continue
            target.copy_(tensor.to(target.dtype))
            loaded += 1
        if unknown:
            raise ValueError(
                f"weight update holds {len(unknown)} tensor(s) that match no parameter of the rollout model (name or "
                f"shape): {unknown[:5]}; the rollout model must be the trainer's model "
                f"(actor_rollout_ref.model.path). Known names look like {list(state)[:3]}"
            )
        return loaded


# verl sends a fused-expert MoE (Qwen3-VL-MoE) one expert at a time, as vLLM loads it; transformers 5 holds the
# experts fused: gate_up_proj (experts, 2 x width, hidden), gate rows first, and down_proj (experts, hidden, width)
EXPERT_WEIGHT = re.compile(
    r"^(?P<experts>.+\.mlp\.experts)\.(?P<index>\d+)\.(?P<part>gate_proj|up_proj|down_proj)\.weight$"
)


def fused_expert_slot(state: dict[str, torch.Tensor], name: str) -> torch.Tensor | None:
    """The view of a fused expert tensor that an expert's own ``gate_proj`` / ``up_proj`` / ``down_proj`` weight
    fills; None when ``name`` is no such weight or the model does not fuse its experts."""
    match = EXPERT_WEIGHT.match(name)
    if match is None:
        return None
    experts, index, part = match["experts"], int(match["index"]), match["part"]
    fused = state.get(f"{experts}.down_proj" if part == "down_proj" else f"{experts}.gate_up_proj")
    if fused is None or index >= fused.shape[0]:
        return None
    if part == "down_proj":
        return fused[index]
    width = fused.shape[1] // 2
    return fused[index, :width] if part == "gate_proj" else fused[index, width:]


def nucleus(logits: torch.Tensor, top_p: float = 1.0, top_k: int = -1) -> torch.Tensor:
    """``logits`` with every token outside the top-k, then top-p, nucleus set to -inf, as vLLM's sampler masks them
    (``apply_top_k_top_p``): top-p drops the least likely tokens while their summed probability stays <= 1 - top_p,
    and keeps at least one."""
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = logits.sort(dim=-1)
        dropped = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - top_p
        dropped[..., -1] = False
        logits = logits.masked_fill(torch.zeros_like(dropped).scatter(-1, order, dropped), float("-inf"))
    return logits


def _left_pad(tensor: torch.Tensor, width: int, fill: int) -> torch.Tensor:
    return torch.nn.functional.pad(tensor, (width - tensor.shape[1], 0), value=fill)


def _positive(temperature: float) -> float:
    return temperature if temperature > 0 else 1.0


def _cut(
    token_ids: list[int], log_probs: list[float], limit: int, stops: Sequence[int]
) -> tuple[list[int], list[float]]:
    """A row of a batch cut at its own token limit, after its first stop token."""
    length = min(limit, len(token_ids))
    for position, token in enumerate(token_ids[:length]):
        if token in stops:
            length = position + 1
            break
    return token_ids[:length], log_probs[:length]
