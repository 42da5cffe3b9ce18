"""Inputs and checks for rollouts: a marked image, and the log-probs the trainer computes for a sample of a generated
batch (``runtime.batch.unpadded_row`` gives one without its padding)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PIL import Image
from verl.protocol import DataProto

if TYPE_CHECKING:
    import torch

    from verl_mm_tools.cpu.hf_engine import HFVisionLM


def marked_image(size: tuple[int, int] = (84, 56)) -> Image.Image:
    """Gray with a red square in the top-left corner, so a rotation is visible in the pixels."""
    image = Image.new("RGB", size, (128, 128, 128))
    image.paste((255, 0, 0), (0, 0, 28, 28))
    return image


def trainer_logprobs(model: HFVisionLM, output: DataProto, row: int = 0) -> torch.Tensor:
    """The response tokens' log-probs of one float32 forward over sample ``row`` of a generated batch, with verl's
    position ids ((4, L) for M-RoPE families, (L,) for Gemma 4) and multimodal inputs: what the trainer computes.
    ``model``: an ``HFVisionLM``."""
    import torch

    from verl_mm_tools.compact_image import expanded_inputs
    from verl_mm_tools.cpu.hf_engine import IMAGE_LAYOUT_KEYS

    attention = output.batch["attention_mask"][row].bool()
    input_ids = output.batch["input_ids"][row][attention].unsqueeze(0)
    position_ids = output.batch["position_ids"][row][..., attention]
    position_ids = position_ids.unsqueeze(1) if position_ids.dim() == 2 else position_ids.unsqueeze(0)
    inputs = expanded_inputs(output.non_tensor_batch["multi_modal_inputs"][row])  # as the trainer's engine does
    images = {key: inputs[key] for key in ("pixel_values", *IMAGE_LAYOUT_KEYS) if key in inputs}
    with torch.no_grad():
        logits = model.model(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), position_ids=position_ids, **images
        ).logits[0]
    prompt_length = int(output.batch["attention_mask"][row, : output.batch["prompts"].shape[1]].sum())
    logprobs = torch.log_softmax(logits[prompt_length - 1 : -1].float(), dim=-1)
    return logprobs.gather(-1, input_ids[0, prompt_length:].unsqueeze(-1)).squeeze(-1)
