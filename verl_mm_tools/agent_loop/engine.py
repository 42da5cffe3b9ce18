"""The rollout engine as the mm_tool loop sees it: verl's server manager, with each generation's reply checked.

verl's ``ToolAgentLoop`` reads only the tokens of a reply. A request the engine aborted (vLLM's ``finish_reason``
"abort", which verl's servers pass on as ``stop_reason`` "aborted": ``pause_generation``, a client disconnect, an
engine that drops a request) would then count as a finished turn, its partial or empty text scored as the model's
answer. Here it raises ``EngineAbortedError``, which masks that trajectory only (the loop's isolation) and names the
cause in ``mm_tool/error``; the masked-batch guard stops a run whose engine aborts most of a batch. An engine that
died raises from verl's client already (vLLM's ``EngineDeadError`` through Ray), with the same outcome.

Under verl's fully async trainer with ``async_training.partial_rollout`` on, a weight sync aborts the generations in
flight and verl's ``FullyAsyncLLMServerClient`` resumes each one with its prompt plus the tokens generated so far
(same images, same sampling parameters, log-probs and MoE routing concatenated): the loop never sees the abort, only
a reply whose ``min_global_steps`` and ``max_global_steps`` differ. That reply is the model's whole turn and trains
as any other; it is recorded here as the generation's ``WeightVersions`` (``resumed``: it spans more than one). With
``partial_rollout: false`` the same client returns the aborted reply, which raises here as above (verl's own loop
would train on the cut text), counted in ``mm_tool/aborted_generations``.

The reply's prefix-cache hits (vLLM's per-request ``num_cached_tokens``, which verl's vLLM server passes on in
``extra_fields``) are kept per generation: the loop writes them on the turn, and the step metrics turn them into the
prefix-cache hit rate from the second turn on (``mm_tool/prefix_cache_hit_rate``). A resumed generation's own
attempts, which verl's client folds into one reply, are recorded by ``resumes``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from verl_mm_tools.agent_loop.resumes import ResumeCost, recorded, recording_view
from verl_mm_tools.errors import VerlMMToolsError

if TYPE_CHECKING:
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import TokenOutput

ABORTED_STOP_REASONS = ("aborted", "abort")  # verl's servers say "aborted"; its fully-async client also checks "abort"


class EngineAbortedError(VerlMMToolsError, RuntimeError):
    """The rollout engine aborted a generation: the trajectory is masked (its last turn never finished)."""


@dataclass(frozen=True)
class WeightVersions:
    """The weight versions (verl's ``global_steps`` of the rollout server) one generation ran under: ``first`` when
    it started, ``last`` when it finished. verl's resuming client reports them as ``min_global_steps`` and
    ``max_global_steps``; a generation a weight sync interrupted and the client resumed spans more than one."""

    first: int
    last: int

    @property
    def span(self) -> int:
        return self.last - self.first

    @property
    def resumed(self) -> bool:
        """Interrupted by a weight sync and resumed (partial rollout). A resume within one version (an abort with
        no sync after it, which verl's fully async trainer does not do) is invisible to the loop."""
        return self.last != self.first

    @classmethod
    def of(cls, extra_fields: Mapping[str, Any] | None) -> WeightVersions | None:
        """From a reply's ``extra_fields``; None where the engine reports no version (e.g. the ``hf`` server)."""
        fields = extra_fields or {}
        first = fields.get("min_global_steps", fields.get("global_steps"))
        last = fields.get("max_global_steps", fields.get("global_steps"))
        if first is None or last is None:
            return None
        return cls(int(first), int(last))


@dataclass(frozen=True)
class GenerationRecord:
    """What one finished generation's reply says beyond its tokens: the prompt tokens vLLM found in its prefix cache
    (None where the engine does not report them), its weight versions, and what resumes cost the engine (None
    outside verl's resuming client)."""

    cached_tokens: int | None
    versions: WeightVersions | None
    resume_cost: ResumeCost | None


class CheckedEngine:
    """verl's server manager (``LLMServerClient``), whose ``generate`` raises on an aborted reply and keeps a
    ``GenerationRecord`` of each finished one in ``generations``. verl builds a loop, and so one of these, per
    trajectory."""

    def __init__(self, server_manager: LLMServerClient):
        self.server_manager = recording_view(server_manager)
        self.generations: list[GenerationRecord] = []
        # the trajectory's images before this one left the context (keep_last_images): verl's loop sends them all
        self.first_image = 0

    async def generate(self, request_id: str, **kwargs: Any) -> TokenOutput:  # verl's keyword arguments, passed on
        if self.first_image and kwargs.get("image_data"):
            kwargs["image_data"] = kwargs["image_data"][self.first_image :]
        with recorded() as attempts:
            output = await self.server_manager.generate(request_id, **kwargs)
        if output.stop_reason in ABORTED_STOP_REASONS:
            raise EngineAbortedError(
                f"the rollout engine aborted generation {len(self.generations) + 1} of the trajectory after "
                f"{len(output.token_ids)} tokens (stop_reason {output.stop_reason!r}); its text is not the model's "
                "answer, so the trajectory is masked. Aborts come from a weight sync (verl's fully async trainer with "
                "async_training.partial_rollout=false; set it to true to resume them) or from the engine (a paused "
                "or restarted server, a dropped request): see the rollout server's log"
            )
        reported = (output.extra_fields or {}).get("num_cached_tokens")
        self.generations.append(
            GenerationRecord(
                cached_tokens=None if reported is None else int(reported),
                versions=WeightVersions.of(output.extra_fields),
                resume_cost=ResumeCost.of(attempts) if attempts else None,
            )
        )
        return output

    def __getattr__(self, name: str) -> Any:  # everything else is verl's client as is
        return getattr(self.server_manager, name)
