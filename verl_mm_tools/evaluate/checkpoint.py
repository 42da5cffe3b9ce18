"""A local checkpoint in the place of verl's inference server: the model a trainer run saved, generating with the
CPU rollout's engine (``HFVisionLM``) on verl's validation sampling settings.

``model_dir`` takes a Hugging Face model folder, or what verl's FSDP trainer writes (``trainer.default_local_dir``,
one of its ``global_step_N`` folders or their ``actor`` folder): its shards are merged into a Hugging Face folder by
verl's own model merger, once per checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl_mm_tools.errors import ConfigError

if TYPE_CHECKING:
    from PIL import Image
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.workers.rollout.replica import TokenOutput

logger = logging.getLogger(__name__)

LATEST = "latest_checkpointed_iteration.txt"  # verl writes the last saved step here


def model_dir(checkpoint: str | Path, merged_root: Path) -> Path:
    """A Hugging Face folder holding the checkpoint's weights (merged under ``merged_root`` when needed)."""
    path = Path(checkpoint)
    if _is_hf_model(path):
        return path
    actor = _actor_dir(path)
    merged = merged_root / f"{actor.parent.name}_{actor.name}"
    if not _is_hf_model(merged):
        _merge(actor, merged)
    return merged


def _is_hf_model(path: Path) -> bool:
    weights = [*path.glob("*.safetensors"), *path.glob("pytorch_model*.bin")]
    return (path / "config.json").is_file() and bool(weights)


def _actor_dir(path: Path) -> Path:
    if (path / LATEST).is_file():  # trainer.default_local_dir: its latest step
        path = path / f"global_step_{(path / LATEST).read_text().strip()}"
    if (path / "actor").is_dir():
        path = path / "actor"
    if not list(path.glob("model_world_size_*_rank_0.pt")) or not (path / "huggingface" / "config.json").is_file():
        found = sorted(entry.name for entry in path.iterdir())[:10] if path.is_dir() else "nothing (no such folder)"
        raise ConfigError(
            f"--checkpoint {path}: neither a Hugging Face model folder (config.json and weights) nor a verl FSDP "
            f"checkpoint (model_world_size_*_rank_0.pt and huggingface/config.json; or its global_step_N folder, or "
            f"trainer.default_local_dir with {LATEST}); found {found}"
        )
    return path


def _merge(actor: Path, target: Path) -> None:
    from verl.model_merger.base_model_merger import ModelMergerConfig
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    logger.info("merging the FSDP checkpoint %s into %s with verl's model merger", actor, target)
    config = ModelMergerConfig(
        operation="merge",
        backend="fsdp",
        local_dir=str(actor),
        target_dir=str(target),
        hf_model_config_path=str(actor / "huggingface"),
    )
    with contextlib.redirect_stdout(sys.stderr):  # the merger prints its progress; stdout is the report's
        FSDPModelMerger(config).merge_and_save()


class CheckpointClient:
    """verl's LLM server client, answered by ``HFVisionLM`` on the checkpoint's weights, one request at a time. A
    prompt with videos is generated from the forward's inputs the trainer computes for it (``trainer_inputs``: the
    frames, grids and M-RoPE positions of the agent-loop worker that runs the loop, bound with ``bind_worker``)."""

    def __init__(self, path: str | Path):
        from verl_mm_tools.cpu.hf_engine import HFVisionLM

        self.engine = HFVisionLM(str(path))
        self.worker: AgentLoopWorker | None = None
        self._lock: asyncio.Lock | None = None
        self._requests = 0  # each request samples with its own seed (see generate)

    def bind_worker(self, worker: AgentLoopWorker) -> None:
        """The agent-loop worker whose loop this client answers: its processor and its trainer-side computations
        make a video prompt's inputs."""
        self.worker = worker

    async def generate(  # verl's client's signature: its other keyword arguments (mm_processor_output) unused
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Image.Image] | None = None,
        video_data: list[Any] | None = None,
        audio_data: list[Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        **kwargs: object,
    ) -> TokenOutput:
        from verl.workers.rollout.replica import TokenOutput

        if audio_data:
            raise ConfigError(
                f"eval's checkpoint engine takes images and videos; request {request_id} holds {len(audio_data)} "
                "audio clip(s): evaluate audio prompts at an endpoint that serves them"
            )
        if self._lock is None:
            self._lock = asyncio.Lock()
        settings: dict[str, Any] = {
            "max_new_tokens": sampling_params.get("max_tokens") or 256,
            "temperature": float(sampling_params.get("temperature", 0.0)),
            "top_p": float(sampling_params.get("top_p", 1.0)),
            "top_k": int(sampling_params.get("top_k", -1)),
        }
        async with self._lock:  # the model runs in a thread; the event loop keeps running the tools
            # the samples of one row send the same prompt: one seed for all would draw one answer N times. Seeds
            # count the requests, so a rerun that asks in the same order draws the same answers.
            seed, self._requests = self._requests, self._requests + 1
            if video_data:  # on the event loop's thread, as the worker runs its own postprocess
                settings["inputs"] = self._trainer_inputs(prompt_ids, image_data, video_data, mm_processor_kwargs)
            token_ids, log_probs = await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.engine.generate(list(prompt_ids), list(image_data or []), seed=seed, **settings)
            )
        return TokenOutput(token_ids=token_ids, log_probs=log_probs, stop_reason="completed", num_preempted=0)

    def _trainer_inputs(
        self,
        prompt_ids: list[int],
        images: list[Image.Image] | None,
        videos: list[Any],
        mm_processor_kwargs: dict[str, Any] | None,
    ) -> dict[str, Any]:
        from verl_mm_tools.evaluate.trainer_inputs import trainer_inputs

        if self.worker is None:
            raise ConfigError(
                "a prompt with videos reaches the checkpoint as the trainer computes its inputs, which takes the "
                "agent-loop worker running the loop: call CheckpointClient.bind_worker(worker) (eval's run does)"
            )
        return trainer_inputs(self.worker, prompt_ids, images, videos, mm_processor_kwargs)
