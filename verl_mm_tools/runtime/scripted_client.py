"""A client of verl's LLM server interface whose model's turns are written by a script: what records demonstrations
through the real loop (the demo's warm and cold starts) and runs the loop without a model (the benchmarks, the
tests); and the text a script writes for a tool call. The test kit's ``ScriptedServer`` adds turns a model
generates."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from PIL import Image
from verl.workers.rollout.replica import TokenOutput

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# A scripted model: (turn k of the trajectory, the request's prompt ids, its images) -> the text it answers, or None
# where the model itself generates the turn (the test kit's ``ScriptedServer`` with a model)
Script = Callable[[int, list[int], list[Image.Image]], "str | None"]

SCRIPTED_WEIGHTS_STEP = 7  # the weight version a scripted client reports for every turn


def scripted_logprob(position: int) -> float:
    """The log-prob a scripted client reports for the n-th token it generates in a request."""
    return -0.01 * (position + 1)


def tool_call_text(name: str, **arguments: object) -> str:
    """The text a Qwen model writes for one tool call, ending its turn (hermes format)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call><|im_end|>"


class ScriptedClient:
    """Stands in for verl's LLM server client: answers turn k of every trajectory with ``script(k, prompt_ids,
    image_data)`` (text, tokenized here, with ``scripted_logprob`` log-probs), or ``turns[k]`` when given a list.
    Records every request (``requests``)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, turns: Sequence[str | None] | Script) -> None:
        self.tokenizer = tokenizer
        self.script: Script = turns if callable(turns) else (lambda turn, prompt_ids, images: turns[turn])
        self.turns_seen: dict[str, int] = {}
        self.requests: list[dict[str, Any]] = []

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Image.Image] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        # verl gives each trajectory its own request id: the k-th request of an id is the trajectory's turn k
        turn = self.turns_seen.get(request_id, 0)
        self.turns_seen[request_id] = turn + 1
        images = list(image_data or [])
        videos = list(kwargs.get("video_data") or [])  # verl's (frames, metadata) per video, in order
        self.requests.append(
            {
                "prompt_ids": list(prompt_ids),
                "images": images,
                "videos": videos,
                "video_payload": kwargs.get("mm_processor_output"),  # what SGLang gets in place of the frames
                "sampling_params": dict(sampling_params),
            }
        )
        token_ids, log_probs = self.answer(turn, list(prompt_ids), images, sampling_params)
        # the weight version, as verl's server client reports it (llm_server.AsyncLLMServerManager.generate)
        versions = dict.fromkeys(("global_steps", "min_global_steps", "max_global_steps"), SCRIPTED_WEIGHTS_STEP)
        return TokenOutput(
            token_ids=token_ids, log_probs=log_probs, num_preempted=0, stop_reason="completed", extra_fields=versions
        )

    def answer(
        self, turn: int, prompt_ids: list[int], images: list[Image.Image], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        """The token ids and log-probs of turn ``turn``: the script's text, cut at ``max_tokens``."""
        text = self.script(turn, prompt_ids, images)
        if text is None:
            raise ValueError(
                f"{type(self).__name__}: turn {turn} is scripted as None (the model's own) without a model"
            )
        token_ids = self.scripted_tokens(text, sampling_params)
        return token_ids, [scripted_logprob(i) for i in range(len(token_ids))]

    def scripted_tokens(self, text: str, sampling_params: dict[str, Any]) -> list[int]:
        """``text``'s token ids (no special tokens added), at most ``max_tokens`` of them."""
        token_ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False)
        return token_ids[: sampling_params.get("max_tokens") or None]
