"""Partial rollout without a trainer: a scripted server that aborts generations mid-turn as a weight sync does, and
verl's own resuming client (``FullyAsyncLLMServerClient``, what verl's fully async rollouter hands its agent loops)
in front of it, in one process.

- ``InterruptingServer``: a ``ScriptedServer`` whose turn k is aborted after the token counts ``interrupts[k]``
  (cumulative), each abort followed by a weight sync (the version it reports goes up by one); a request that carries
  an aborted generation's tokens after its prompt continues it;
- ``resuming_client(server)``: verl's ``FullyAsyncLLMServerClient`` over that server, through an in-process
  stand-in for verl's load balancer; pass it as ``LocalRollout.run(..., client=resuming_client)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from omegaconf import DictConfig
from verl.workers.rollout.replica import TokenOutput

from verl_mm_tools.runtime.scripted_client import SCRIPTED_WEIGHTS_STEP, scripted_logprob
from verl_mm_tools.runtime.workers import InProcessActor
from verl_mm_tools.testkit.scripted import ScriptedServer, prefix_cache_hits

if TYPE_CHECKING:
    from PIL import Image
    from transformers import PreTrainedTokenizerBase
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

ROUTING_LAYERS, ROUTING_TOP_K = 2, 2


def scripted_routing(token_count: int) -> np.ndarray:
    """MoE routing (tokens, layers, top-k) over a request's whole sequence, as vLLM returns it: a function of the
    position only, so a resumed generation's concatenated routing equals an uninterrupted one's."""
    size = token_count * ROUTING_LAYERS * ROUTING_TOP_K
    return (np.arange(size, dtype=np.int32).reshape(token_count, ROUTING_LAYERS, ROUTING_TOP_K) // 3) % 8


@dataclass(frozen=True)
class _Aborted:
    """A generation the server aborted: its turn, its whole scripted tokens and how many it had generated."""

    turn: int
    tokens: list[int]
    generated: int


class InterruptingServer(ScriptedServer):
    """A scripted server whose generations a weight sync interrupts: turn k's generation is aborted (verl's
    ``stop_reason`` "aborted") once it holds each of the cumulative token counts ``interrupts[k]``, and the weight
    version it reports (``global_steps``) then goes up by one. A request whose prompt is an aborted request's prompt
    plus the tokens generated so far continues that generation with the same script (log-probs by position in the
    turn, as ``ScriptedServer``'s). Turns are told by the prompt (``turn_of``: by default the number of
    ``<|im_start|>assistant`` in it, less one), since verl's client sends every request under a fresh id.

    Each reply reports vLLM's prefix-cache hits (``num_cached_tokens``): the longest prefix the request shares with
    one sent under the current weights, in whole blocks of ``PREFIX_BLOCK`` and short of the prompt's last token, as
    vLLM counts them; a weight sync empties the cache, as verl's sync resets vLLM's.

    ``aborts`` counts the aborts, ``resumes`` the requests that continued one; ``routing`` adds MoE routing."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        turns: Sequence[str] | Callable[[int, list[int], list[Image.Image]], str],
        interrupts: Mapping[int, Sequence[int]] | None = None,
        *,
        version: int = SCRIPTED_WEIGHTS_STEP,
        routing: bool = False,
        turn_of: Callable[[list[int]], int] | None = None,
    ) -> None:
        super().__init__(tokenizer, turns)
        self.interrupts = {turn: sorted(points) for turn, points in (interrupts or {}).items()}
        self.version = version
        self.routing = routing
        self.turn_of = turn_of or self._assistant_turns
        self.pending: dict[tuple[int, ...], _Aborted] = {}
        self.cached_prompts: list[list[int]] = []  # the prefix cache: prompts sent since the last weight sync
        self.aborts = 0
        self.resumes = 0

    def _assistant_turns(self, prompt_ids: list[int]) -> int:
        return self.tokenizer.decode(prompt_ids).count("<|im_start|>assistant") - 1

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Image.Image] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        prompt_ids = list(prompt_ids)
        images = list(image_data or [])
        self.requests.append({"prompt_ids": prompt_ids, "images": images, "sampling_params": dict(sampling_params)})
        aborted = self.pending.pop(tuple(prompt_ids), None)
        if aborted is None:
            turn = self.turn_of(prompt_ids)
            text = self.script(turn, prompt_ids, images)
            if text is None:
                raise ValueError("InterruptingServer scripts every turn (no model)")
            aborted = _Aborted(turn, self.tokenizer.encode(text, add_special_tokens=False), 0)
        else:
            self.resumes += 1
        start = aborted.generated
        limit = sampling_params.get("max_tokens")
        end = len(aborted.tokens) if limit is None else min(len(aborted.tokens), start + limit)
        stop = next((point for point in self.interrupts.get(aborted.turn, []) if start < point < end), None)
        if stop is not None:
            end = stop
        new = aborted.tokens[start:end]
        version = self.version
        cached = prefix_cache_hits(prompt_ids, self.cached_prompts)
        self.cached_prompts.append(prompt_ids)
        if stop is not None:  # aborted for a weight sync: continued under the next version, the cache emptied
            self.pending[tuple(prompt_ids + new)] = _Aborted(aborted.turn, aborted.tokens, end)
            self.aborts += 1
            self.version += 1
            self.cached_prompts.clear()
        return TokenOutput(
            token_ids=new,
            log_probs=[scripted_logprob(position) for position in range(start, end)],
            routed_experts=scripted_routing(len(prompt_ids) + len(new)) if self.routing else None,
            num_preempted=0,
            stop_reason="aborted" if stop is not None else "completed",
            extra_fields={"global_steps": version, "num_cached_tokens": cached},
        )


class LocalBalancer:
    """An in-process stand-in for verl's global load balancer (``workers/rollout/router``) with one server: what
    verl's ``LLMServerClient`` calls on it, through ``InProcessActor``."""

    def __init__(self, server: object):
        self.server = InProcessActor(server)
        self.in_flight = 0

    async def require_acquire_fields(self) -> list[str]:
        return []

    async def require_release_fields(self) -> list[str]:
        return []

    async def acquire_server(self, request_id: str, **fields: object) -> tuple[str, InProcessActor]:
        self.in_flight += 1
        return "local", self.server

    def release_server(self, server_id: str, **fields: object) -> None:  # verl calls it without awaiting
        self.in_flight -= 1


def resuming_client(config: DictConfig, server: object) -> FullyAsyncLLMServerClient:
    """verl's ``FullyAsyncLLMServerClient`` (the client of its fully async rollouter) in front of ``server``: it
    resumes an aborted generation with the tokens so far unless ``async_training.partial_rollout`` is false."""
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

    balancer: Any = InProcessActor(LocalBalancer(server))  # a Ray actor handle's stand-in
    return FullyAsyncLLMServerClient(config, load_balancer_handle=balancer)
