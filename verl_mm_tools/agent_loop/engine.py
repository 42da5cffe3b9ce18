"""The rollout engine as the mm_tool loop sees it: verl's server manager, with each generation's reply checked.

verl's ``ToolAgentLoop`` reads only the tokens of a reply. A request the engine aborted (vLLM's ``finish_reason``
"abort", which verl's servers pass on as ``stop_reason`` "aborted": ``pause_generation``, a client disconnect, an
engine that drops a request) would then count as a finished turn, its partial or empty text scored as the model's
answer. Here it raises ``EngineAbortedError``, which masks that trajectory only (the loop's isolation) and names the
cause in ``mm_tool/error``; the masked-batch guard stops a run whose engine aborts most of a batch. An engine that
died raises from verl's client already (vLLM's ``EngineDeadError`` through Ray), with the same outcome.

The reply's prefix-cache hits (vLLM's per-request ``num_cached_tokens``, which verl's vLLM server passes on in
``extra_fields``) are kept per generation: the loop writes them on the turn, and the step metrics turn them into the
prefix-cache hit rate from the second turn on (``mm_tool/prefix_cache_hit_rate``).
"""

from __future__ import annotations

from typing import Any

from verl_mm_tools.errors import VerlMMToolsError

ABORTED_STOP_REASONS = ("aborted", "abort")  # verl's servers say "aborted"; its fully-async client also checks "abort"


class EngineAbortedError(VerlMMToolsError, RuntimeError):
    """The rollout engine aborted a generation: the trajectory is masked (its last turn never finished)."""


class CheckedEngine:
    """verl's server manager (``LLMServerClient``), whose ``generate`` raises on an aborted reply and keeps each
    reply's prefix-cache hits in ``cached_tokens`` (None where the engine does not report them). verl builds a loop,
    and so one of these, per trajectory."""

    def __init__(self, server_manager: Any):
        self.server_manager = server_manager
        self.cached_tokens: list[int | None] = []

    async def generate(self, request_id, **kwargs) -> Any:
        output = await self.server_manager.generate(request_id, **kwargs)
        if output.stop_reason in ABORTED_STOP_REASONS:
            raise EngineAbortedError(
                f"the rollout engine aborted generation {len(self.cached_tokens) + 1} of the trajectory after "
                f"{len(output.token_ids)} tokens (stop_reason {output.stop_reason!r}); its text is not the model's "
                "answer, so the trajectory is masked. Aborts come from the engine (a paused or restarted server, a "
                "dropped request): see the rollout server's log"
            )
        reported = (output.extra_fields or {}).get("num_cached_tokens")
        self.cached_tokens.append(None if reported is None else int(reported))
        return output

    def __getattr__(self, name: str) -> Any:  # everything else is verl's client as is
        return getattr(self.server_manager, name)
