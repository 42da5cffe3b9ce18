"""The HF rollout server: a Ray actor answering verl's token-in/token-out ``generate()`` with a transformers model.

verl's agent loops send one request per turn and many trajectories run concurrently. The server queues requests and
runs them in batches: while one batch generates (in a thread, so the actor keeps accepting requests), the next
requests wait, and all of them form the next batch. Requests in a batch share their sampling settings.

The trainer pushes its weights after every step (``update_weights``); generation and weight updates never overlap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from verl.workers.rollout.replica import TokenOutput

from verl_mm_tools.cpu.hf_engine import LOGPROBS_MODES, PROCESSED_LOGPROBS, HFVisionLM
from verl_mm_tools.cpu.platform import CPU_BACKEND
from verl_mm_tools.errors import ConfigError

if TYPE_CHECKING:
    from PIL import Image

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE = 64
# Requests that arrive within this window of the first one join its batch (the agent loop fires many at once).
BATCH_WINDOW_S = 0.005


@dataclass
class _Request:
    prompt_ids: list[int]
    images: list[Image.Image]
    max_new_tokens: int
    sampling: tuple[float, float, int, tuple[int, ...]]
    future: asyncio.Future = field(repr=False)


def sampling_key(sampling_params: dict[str, Any]) -> tuple[float, float, int, tuple[int, ...]]:
    """(temperature, top_p, top_k, extra stop tokens) from verl's sampling params; requests batch together only when
    these match. The stop tokens are vLLM's ``stop_token_ids``: verl's tool parsers add theirs (Gemma 4 stops at
    <tool_call|>), and a call must end there on this server as on vLLM."""
    return (
        float(sampling_params.get("temperature", 1.0)),
        float(sampling_params.get("top_p", 1.0)),
        int(sampling_params.get("top_k", -1)),
        tuple(sorted(int(token) for token in sampling_params.get("stop_token_ids") or ())),
    )


@CPU_BACKEND.implements
class HFRolloutServer:
    """Serves ``generate`` for one rollout replica. Wrapped with ``ray.remote`` by ``HFReplica``."""

    def __init__(
        self,
        model_path: str,
        *,
        response_length: int,
        seed: int = 0,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        num_threads: int | None = None,
        logprobs_mode: str = PROCESSED_LOGPROBS,
    ):
        if logprobs_mode not in LOGPROBS_MODES:
            raise ConfigError(
                f"the hf rollout server returns log-probs: actor_rollout_ref.rollout.logprobs_mode must be "
                f"one of {LOGPROBS_MODES}, got {logprobs_mode!r} (logits modes need rollout.name=vllm)"
            )
        self.logprobs_mode = logprobs_mode
        if num_threads:
            torch.set_num_threads(num_threads)
        torch.manual_seed(seed)
        self.engine = HFVisionLM(model_path)
        self.response_length = response_length
        self.max_batch_size = max_batch_size
        self.global_steps: int | None = None
        self._pending: list[_Request] = []
        self._lock = asyncio.Lock()  # one batch or one weight update at a time
        self._batcher: asyncio.Task | None = None
        self.stats = {"requests": 0, "batches": 0, "generate_s": 0.0, "weight_updates": 0}

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list | None = None,
        video_data: list | None = None,
        **kwargs: object,
    ) -> TokenOutput:
        if video_data:
            raise ValueError(
                f"the hf rollout server takes images only, got {len(video_data)} video(s) in "
                f"request {request_id}; use rollout.name=vllm or sglang for video"
            )
        max_tokens = sampling_params.get("max_tokens") or self.response_length
        request = _Request(
            list(prompt_ids),
            list(image_data or []),
            int(max_tokens),
            sampling_key(sampling_params),
            asyncio.get_running_loop().create_future(),
        )
        self._pending.append(request)
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._drain())
        token_ids, log_probs, version = await request.future
        extra = {"global_steps": version} if version is not None else {}
        return TokenOutput(
            token_ids=token_ids, log_probs=log_probs, stop_reason="completed", num_preempted=0, extra_fields=extra
        )

    async def _drain(self) -> None:
        await asyncio.sleep(BATCH_WINDOW_S)
        while self._pending:
            batch = self._take_batch()
            async with self._lock:
                await self._run(batch)

    def _take_batch(self) -> list[_Request]:
        key = self._pending[0].sampling
        batch = [request for request in self._pending if request.sampling == key][: self.max_batch_size]
        taken = {id(request) for request in batch}
        self._pending = [request for request in self._pending if id(request) not in taken]
        return batch

    async def _run(self, batch: list[_Request]) -> None:
        temperature, top_p, top_k, stop_token_ids = batch[0].sampling
        started, version = time.perf_counter(), self.global_steps  # the weights of the whole batch (under the lock)
        try:
            results = await asyncio.to_thread(
                self.engine.generate_batch,
                [(request.prompt_ids, request.images) for request in batch],
                max_new_tokens=[request.max_new_tokens for request in batch],
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                logprobs_mode=self.logprobs_mode,
                stop_token_ids=stop_token_ids,
            )
        except Exception as error:  # noqa: BLE001 - every waiting trajectory gets the error, not a hang
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(error)
            return
        for request, result in zip(batch, results, strict=True):
            if not request.future.done():  # a cancelled caller (verl aborted the trajectory) no longer waits
                request.future.set_result((*result, version))
        self.stats["requests"] += len(batch)
        self.stats["batches"] += 1
        self.stats["generate_s"] += time.perf_counter() - started

    async def update_weights(
        self, named_tensors: list[tuple[str, torch.Tensor]], global_steps: int | None = None
    ) -> int:
        async with self._lock:
            loaded = await asyncio.to_thread(self.engine.load_weights, named_tensors)
        self.stats["weight_updates"] += 1
        if global_steps is not None:
            self.global_steps = global_steps
        return loaded

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    def get_stats(self) -> dict[str, float]:
        return dict(self.stats)

    # verl's replica/manager lifecycle calls. The HF model keeps its weights and has no KV cache between requests,
    # so memory management is a no-op.
    async def wake_up(self, *args: object, **kwargs: object) -> None:
        return None

    async def sleep(self, *args: object, **kwargs: object) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, int | list[str]]:
        # Nothing to abort for a weight update: batches and weight updates take turns under the lock, so every
        # response comes from one weight version, which it reports (verl's staleness tags stay exact).
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        return None

    async def start_profile(self, **kwargs: object) -> None:
        return None

    async def stop_profile(self) -> None:
        return None
