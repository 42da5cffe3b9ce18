"""A transformers model behind verl's token-in/token-out interface: generate and score with images, on CPU.

Two traps it handles (both seen with transformers 5 and Qwen-VL):
- M-RoPE is applied only when ``mm_token_type_ids`` is passed; without it rollout and trainer log-probs differ by up
  to 0.19. We always pass it.
- A degenerate policy samples vision placeholder tokens, which crashes verl's postprocess. We never sample them (they
  are suppressed), while log-probs still come from the raw logits, as the trainer recomputes them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from PIL import Image

from verl_mm_tools.agent_loop.validation import vision_token_ids

logger = logging.getLogger(__name__)


class HFVisionLM:
    """A Qwen-VL checkpoint in transformers, answering token-level generate/score requests."""

    def __init__(self, model_path: str, *, dtype: torch.dtype = torch.float32):
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.processor = AutoProcessor.from_pretrained(model_path)
        self.tokenizer = self.processor.tokenizer
        self.model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=dtype).eval()
        vocab = self.tokenizer.get_vocab()
        self.image_token_id = vocab.get("<|image_pad|>")
        self.video_token_id = vocab.get("<|video_pad|>")
        self.forbidden_token_ids = sorted(vision_token_ids(self.tokenizer))
        self.eos_token_ids = [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]

    def model_inputs(self, token_ids: Sequence[int], images: Sequence[Image.Image] = ()) -> dict[str, torch.Tensor]:
        """Forward inputs for token ids whose image placeholders are already expanded."""
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long)
        inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
        if images:
            features = self.processor.image_processor(images=list(images), return_tensors="pt")
            inputs["pixel_values"] = features["pixel_values"].to(self.model.dtype)
            inputs["image_grid_thw"] = features["image_grid_thw"]
        token_types = torch.zeros_like(input_ids)
        if self.image_token_id is not None:
            token_types[input_ids == self.image_token_id] = 1
        if self.video_token_id is not None:
            token_types[input_ids == self.video_token_id] = 2
        inputs["mm_token_type_ids"] = token_types
        return inputs

    @torch.no_grad()
    def score(self, prompt_ids: Sequence[int], continuation: Sequence[int], images: Sequence[Image.Image] = (),
              temperature: float = 1.0) -> list[float]:
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
    ) -> tuple[list[int], list[float]]:
        """Sample (greedy when temperature is 0) up to ``max_new_tokens``; returns (token ids, log-probs)."""
        inputs = self.model_inputs(prompt_ids, images)
        sampling = {"do_sample": False} if temperature <= 0 else {
            "do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": top_k if top_k > 0 else 0}
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                suppress_tokens=self.forbidden_token_ids,
                eos_token_id=self.eos_token_ids,
                pad_token_id=self.tokenizer.pad_token_id,
                output_logits=True,
                return_dict_in_generate=True,
                **sampling,
            )
        token_ids = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
        raw = torch.stack(out.logits, dim=1)[0, : len(token_ids)].float() / _positive(temperature)
        log_probs = torch.log_softmax(raw, dim=-1).gather(-1, torch.tensor(token_ids).unsqueeze(-1)).squeeze(-1)
        return token_ids, log_probs.tolist()


def _positive(temperature: float) -> float:
    return temperature if temperature > 0 else 1.0
