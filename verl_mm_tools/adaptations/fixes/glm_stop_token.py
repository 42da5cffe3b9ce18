"""GLM-V, the stop token after a tool call is never trained. A GLM turn ends where the next role token starts: the
model stops at ``<|observation|>`` and the tool results verl appends start with ``<|observation|>``. verl's
``GLMContinuousTokenBuilder._merge_context_token_ids`` drops the generated token from the prefix and keeps the
appended one, so the stream is right but the token the model wrote (and its log-prob) becomes context with mask 0.
Fixed: when the appended context starts with the very token the prefix ends with, that token stays generated and the
context's copy is dropped (Qwen's builder treats its ``<|im_end|>`` the same way). A prefix ending in a stop token the
context does not start with (no call was parsed, a user turn follows) is left to verl, which drops it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    from verl.utils.tokenizer.continuous_token import GLMContinuousTokenBuilder, MergeResult

TARGET = Target(
    "verl.utils.tokenizer.continuous_token",
    "GLMContinuousTokenBuilder._merge_context_token_ids",
    "61be7850b07d69f88b4106bcc90b0fdcd98ce0e0ee23d717d26871c49e73288a",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="when the appended context starts with the stop token the prefix ends with (`<|observation|>` after a tool "
    "call), the generated one stays and the context's copy goes",
    why="verl drops the generated token and keeps the context's: the stream is right but the policy's stop after a "
    "call has mask 0 and is never trained",
    applies_to=VERL,
    proof="`tests/adaptations/test_verl_fixes_on_cpu.py::test_verls_glm_merge_makes_the_generated_stop_token_context`",
)


@ADAPTATION.replaces(TARGET)
def _merge_context_token_ids(
    merge: Callable[..., MergeResult],
    self: GLMContinuousTokenBuilder,
    runtime_token_ids: list[int],
    appended_token_ids: list[int],
    **kwargs: object,
) -> MergeResult:
    stop = runtime_token_ids[-1] if runtime_token_ids else None
    if stop in self._ambiguous_boundary_ids and appended_token_ids and appended_token_ids[0] == stop:
        from verl.utils.tokenizer.continuous_token import MergeResult

        appended = list(appended_token_ids[1:])
        return MergeResult(token_ids=[*runtime_token_ids, *appended], appended_token_count=len(appended))
    return merge(self, runtime_token_ids, appended_token_ids, **kwargs)
