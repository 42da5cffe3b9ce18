"""What partial rollout's resumes cost the engine, per generation.

Under verl's fully async trainer a weight sync aborts the generations in flight, and verl's
``FullyAsyncLLMServerClient`` resumes each one: it sends the prompt plus the tokens generated so far, with every
image again. The sync has reset vLLM's prefix, multimodal and encoder caches (verl's ``clear_kv_cache`` /
``abort_all_requests``), so vLLM prefills that whole sequence again and runs every image through its vision encoder
again. verl's client returns one reply for all of a generation's attempts and keeps only the first attempt's
prefix-cache hits, so the loop cannot see this cost from the reply.

``ResumeRecordingClient`` is verl's client with one class between it and its base: the resume loop calls the base's
``generate`` once per attempt through ``super()``, and that call is recorded (its prompt length, the prefix-cache hits
vLLM reports for it, its images) into the list the calling generation set (a context variable, so
concurrent trajectories of one worker keep theirs apart). ``recording_view`` puts that class over the worker's
client without touching verl's object (a second instance sharing its ``__dict__``). Inventory row 41
(``docs/verl_adaptations.md``), guarded by the sha256 of verl's resume loop.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient

from verl_mm_tools.adaptations.guard import confirm
from verl_mm_tools.adaptations.record import Adaptation, Section, Target

if TYPE_CHECKING:
    from verl.workers.rollout.replica import TokenOutput

_ATTEMPTS: contextvars.ContextVar[list[Attempt] | None] = contextvars.ContextVar("mm_tool_attempts", default=None)


ADAPTATION = Adaptation(
    section=Section.EXTENSIONS,
    targets=(
        Target(
            "verl.workers.rollout.llm_server",
            "FullyAsyncLLMServerClient.generate",
            "3d6399350ff024fd974ac921bc42f8a061ad81adaca593db1de2265cba43f6b0",
        ),
    ),
    what=(
        "used by the mm_tool loop's engine (`agent_loop/engine.py`) when verl hands it the resuming client: "
        "puts a class between verl's resuming client and its base, so each attempt of the resume loop (one "
        "`super().generate` per abort) is recorded: the prompt tokens sent, vLLM's prefix-cache hits for it, the "
        "images sent; a view sharing the client's `__dict__`, verl's object untouched"
    ),
    why=(
        "verl's client returns one reply for all of a generation's attempts and keeps only the first attempt's "
        "`num_cached_tokens`: what a resume costs the engine (a whole prefill and every image's encoding "
        "again, since the sync reset vLLM's caches) is not visible otherwise"
    ),
    applies_to="verl 0.9.1 (`verl.workers.rollout.llm_server`)",
    proof=(
        "none (an observation); exact against a scripted server: "
        "`tests/agent_loop/test_partial_rollout_on_cpu.py::"
        "test_a_resumed_trajectory_equals_the_uninterrupted_one_but_for_its_weight_versions`"
    ),
)


@dataclass(frozen=True)
class Attempt:
    """One request of a generation to the engine: the prompt tokens sent (the turn's prompt, plus the tokens
    generated so far on a resume), those the engine's prefix cache held (None where it does not report them), the
    images sent."""

    prompt_tokens: int
    cached_tokens: int | None
    images: int


@dataclass(frozen=True)
class ResumeCost:
    """A generation's attempts after its first: how many (``resumes``), the prompt tokens the engine prefilled again
    for them (sent less its prefix-cache hits), and the images sent again (the sync reset vLLM's encoder cache, so
    each runs through the vision encoder again)."""

    resumes: int = 0
    prefilled_tokens: int = 0
    images: int = 0

    @classmethod
    def of(cls, attempts: Sequence[Attempt]) -> ResumeCost:
        resumed = attempts[1:]
        return cls(
            resumes=len(resumed),
            prefilled_tokens=sum(attempt.prompt_tokens - (attempt.cached_tokens or 0) for attempt in resumed),
            images=sum(attempt.images for attempt in resumed),
        )


class _AttemptLog(LLMServerClient):
    """verl's base client, recording each call into the calling generation's list (when it set one)."""

    async def generate(  # verl's signature; its other keyword arguments passed on
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Any] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        output = await super().generate(
            request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, image_data=image_data, **kwargs
        )
        attempts = _ATTEMPTS.get()
        if attempts is not None:
            cached = (output.extra_fields or {}).get("num_cached_tokens")
            attempts.append(
                Attempt(
                    prompt_tokens=len(prompt_ids),
                    cached_tokens=None if cached is None else int(cached),
                    images=len(image_data or []),
                )
            )
        return output


@ADAPTATION.implements
class ResumeRecordingClient(FullyAsyncLLMServerClient, _AttemptLog):
    """verl's resuming client whose every attempt is recorded (its ``super().generate`` reaches ``_AttemptLog``)."""


def recording_view(client: LLMServerClient) -> LLMServerClient:
    """``client`` where each of its generations' attempts can be recorded (``recorded``): verl's resuming client
    as a ``ResumeRecordingClient`` sharing its state; any other client as it is (it makes one attempt)."""
    if type(client) is not FullyAsyncLLMServerClient:
        return client
    confirm(ADAPTATION)  # verl's resume loop changed: refuses to start
    view = ResumeRecordingClient.__new__(ResumeRecordingClient)
    view.__dict__ = client.__dict__  # the same load balancer, config and cached fields
    return view


@contextlib.contextmanager
def recorded() -> Iterator[list[Attempt]]:
    """``with recorded() as attempts:`` around a generation: ``attempts`` lists its requests to the engine (empty
    where the client is not a recording view)."""
    attempts: list[Attempt] = []
    token = _ATTEMPTS.set(attempts)
    try:
        yield attempts
    finally:
        _ATTEMPTS.reset(token)
