"""Generation batches as verl's dataset builds them (raw prompts plus per-sample columns), and one sample of a
generated batch without its padding."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image
from verl.protocol import DataProto


def image_prompt(text: str, images: Sequence[Image.Image] = ()) -> list[dict]:
    """A user message holding the images then the text, as verl's dataset builds it."""
    content = [{"type": "image", "image": image} for image in images] + [{"type": "text", "text": text}]
    return [{"role": "user", "content": content}]


def make_batch(prompts: Sequence[list[dict]], **columns: Sequence[object]) -> DataProto:
    """A generation batch of raw prompts plus optional per-sample columns (agent_name, tools_kwargs, extra_info)."""
    size = len(prompts)
    non_tensor = {"raw_prompt": object_array(prompts), "index": np.arange(size)}
    for name, values in columns.items():
        non_tensor[name] = object_array(values)
    return DataProto.from_dict(non_tensors=non_tensor, meta_info={"global_steps": 1, "validate": False})


def object_array(values: Sequence[object]) -> np.ndarray:
    """A 1-D object array of ``values`` (np.array would make a list of equal-length lists 2-D)."""
    array = np.empty(len(values), dtype=object)
    for index, value in enumerate(values):
        array[index] = value
    return array


def unpadded_row(output: DataProto, index: int = 0) -> dict[str, list]:
    """One sample of a generated batch without padding: prompt ids, response ids, mask and rollout log-probs."""
    prompt_width = output.batch["prompts"].shape[1]
    attention = output.batch["attention_mask"][index]
    prompt_part, response_part = attention[:prompt_width].bool(), attention[prompt_width:].bool()
    row = {
        "prompt_ids": output.batch["prompts"][index][prompt_part].tolist(),
        "response_ids": output.batch["responses"][index][response_part].tolist(),
        "response_mask": output.batch["response_mask"][index][response_part].tolist(),
    }
    if "rollout_log_probs" in output.batch.keys():
        row["logprobs"] = output.batch["rollout_log_probs"][index][response_part].tolist()
    return row
