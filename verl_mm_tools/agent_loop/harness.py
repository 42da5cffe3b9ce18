"""Run agent loops in-process through verl's real ``AgentLoopWorker`` (no Ray, no GPU): a composed verl trainer
config, a scripted inference server, and a batch builder. Used by the tests, the benchmarks and the CLI.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from omegaconf import DictConfig
from PIL import Image
from verl.protocol import DataProto
from verl.workers.rollout.replica import TokenOutput


def compose_trainer_config(model_path: str, overrides: Sequence[str] = ()) -> DictConfig:
    """verl's own ``ppo_trainer`` config through hydra, with the model path and the given overrides."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    base = [
        f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.agent.default_agent_loop=mm_tool",
    ]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[*base, *overrides])


def scripted_logprob(position: int) -> float:
    """The log-prob the scripted server reports for the n-th token it generates in a request."""
    return -0.01 * (position + 1)


class ScriptedServer:
    """Stands in for verl's LLM server client: answers turn k of every trajectory with ``script(k, prompt_ids,
    image_data)`` (text, tokenized here), or ``turns[k]`` when given a list. Records every request."""

    def __init__(self, tokenizer, turns: Sequence[str] | Callable[[int, list[int], list], str]):
        self.tokenizer = tokenizer
        self.script = turns if callable(turns) else (lambda turn, prompt_ids, images: turns[turn])
        self.header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
        self.requests: list[dict[str, Any]] = []

    def _turn(self, prompt_ids: list[int]) -> int:
        width = len(self.header)
        starts = sum(prompt_ids[i : i + width] == self.header for i in range(len(prompt_ids) - width + 1))
        return starts - 1

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, **kwargs) -> TokenOutput:
        turn = self._turn(list(prompt_ids))
        images = list(image_data or [])
        self.requests.append({"prompt_ids": list(prompt_ids), "images": images, "sampling_params": dict(sampling_params)})
        token_ids = self.tokenizer.encode(self.script(turn, list(prompt_ids), images), add_special_tokens=False)
        token_ids = token_ids[: sampling_params.get("max_tokens") or len(token_ids)]
        log_probs = [scripted_logprob(i) for i in range(len(token_ids))]
        return TokenOutput(token_ids=token_ids, log_probs=log_probs, num_preempted=0, stop_reason="completed")


def make_worker(config: DictConfig, server) -> Any:
    """verl's real AgentLoopWorker (the class Ray would wrap), talking to ``server``."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    return AgentLoopWorker(config, server)


def image_prompt(text: str, images: Sequence[Image.Image] = ()) -> list[dict]:
    """A user message holding the images then the text, as verl's dataset builds it."""
    content = [{"type": "image", "image": image} for image in images] + [{"type": "text", "text": text}]
    return [{"role": "user", "content": content}]


def make_batch(prompts: Sequence[list[dict]], **columns: Sequence[Any]) -> DataProto:
    """A generation batch of raw prompts plus optional per-sample columns (agent_name, tools_kwargs, extra_info)."""
    size = len(prompts)
    non_tensor = {"raw_prompt": _objects(prompts), "index": np.arange(size)}
    for name, values in columns.items():
        non_tensor[name] = _objects(values)
    return DataProto.from_dict(non_tensors=non_tensor, meta_info={"global_steps": 1, "validate": False})


def _objects(values: Sequence[Any]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array


def generate(worker, batch: DataProto) -> DataProto:
    return asyncio.run(worker.generate_sequences(batch))
