"""Invariants every trajectory must satisfy before it leaves the loop.

verl's postprocess builds pixel_values from the image list alone and never compares them with the placeholder tokens,
so a mismatch would surface only in the model forward ("Image features and image tokens do not match", verl issues
#4050, #3708, #3469). We compare here, per image and in order, with the processor's own token count.
"""

from __future__ import annotations


def placeholder_runs(token_ids: list[int], image_token_id: int) -> list[int]:
    """Lengths of the consecutive runs of the image placeholder token, in order."""
    runs: list[int] = []
    previous = None
    for token in token_ids:
        if token == image_token_id:
            if previous == image_token_id:
                runs[-1] += 1
            else:
                runs.append(1)
        previous = token
    return runs


def trajectory_problems(
    *,
    prompt_ids: list[int],
    response_ids: list[int],
    response_mask: list[int],
    response_logprobs: list[float] | None,
    image_tokens: list[int],
    image_token_id: int | None,
    forbidden_generated: frozenset[int],
    video_tokens: int = 0,
    video_token_id: int | None = None,
) -> list[str]:
    """Every violated invariant, as sentences for a log line (empty when the trajectory is sound)."""
    problems = []
    if len(response_mask) != len(response_ids):
        problems.append(f"response_mask has {len(response_mask)} entries for {len(response_ids)} response tokens")
    if response_logprobs is not None and len(response_logprobs) != len(response_ids):
        problems.append(f"response_logprobs has {len(response_logprobs)} entries for {len(response_ids)} tokens")
    if image_token_id is not None:
        runs = placeholder_runs(prompt_ids + response_ids, image_token_id)
        if runs != image_tokens:
            problems.append(
                f"image placeholder runs {runs} do not match the processor's tokens per image {image_tokens}"
            )
    if video_token_id is not None:
        found = (prompt_ids + response_ids).count(video_token_id)
        if found != video_tokens:
            problems.append(
                f"{found} video placeholder tokens do not match the processor's {video_tokens} for the videos"
            )
    generated = [token for token, mask in zip(response_ids, response_mask) if mask and token in forbidden_generated]
    if generated:
        problems.append(f"the model generated vision placeholder tokens {sorted(set(generated))}")
    return problems
