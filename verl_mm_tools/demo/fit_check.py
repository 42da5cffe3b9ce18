"""What a cold start has learned, read off its demonstrations teacher-forced (``ColdStartCheck``): how likely it writes
each demonstration's first turn (the call, or the answer's format), and whether it reads the tool's answer. RL can
only reinforce what the cold start writes: a fit that ended with half its calls unparseable, or that answers at
chance after a call, gives RL nothing to learn from (two of three video cold starts, docs/experiments/video_task.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from verl_mm_tools.demo.fit import collate, model_inputs

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# A first turn's probability below which it counts as not learned: a call's ~40 tokens at p 0.99 each give 0.67
FIRST_TURN_FLOOR = 0.8
READING_FLOOR = 0.9  # the probability of the true answer after a call


@dataclass(frozen=True)
class ColdStartCheck:
    """Means over the demonstrations, each the fitted model's probability of a demonstration's own tokens."""

    call: float  # of a calling demonstration's whole first turn (the call), given its prompt
    direct: float  # of a direct demonstration's first turn apart from its (random) answer
    call_share: float  # of the first token of a call rather than of an answer, where the turns start
    reading: float | None  # of the true answer after the tool's answer (None: the answers there are not the truth)

    def failures(self, direct_share: float) -> list[str]:
        """What keeps RL from learning on this cold start (empty: nothing)."""
        expected = 1 - direct_share
        found = []
        if self.call < FIRST_TURN_FLOOR * expected:
            found.append(f"p(its call) {self.call:.3f} < {FIRST_TURN_FLOOR} x the calling share {expected:.2f}")
        if self.direct < FIRST_TURN_FLOOR * direct_share:
            found.append(f"p(its direct answer's format) {self.direct:.3f} < {FIRST_TURN_FLOOR} x {direct_share:.2f}")
        if not 0.5 * expected <= self.call_share <= min(1.0, 1.5 * expected):
            found.append(f"it starts a call with p {self.call_share:.3f}, the demonstrations in {expected:.2f}")
        if self.reading is not None and self.reading < READING_FLOOR:
            found.append(f"p(the true answer after a call) {self.reading:.3f} < {READING_FLOOR}")
        return found


@torch.no_grad()
def cold_start_check(model: PreTrainedModel, examples: list[dict], *, reads: bool) -> ColdStartCheck:
    """``ColdStartCheck`` of ``model`` on its (non-``sight``) demonstrations, ``reads`` where their answers after a
    call are the true ones (``AfterCall.TRUE``)."""
    own = [example for example in examples if not example["sight"]]
    call_token = next(
        (int(example["labels"][first_labelled_run(example["labels"])[0]]) for example in own if example["calls"]), -1
    )
    calling = [turn_probabilities(model, example, call_token) for example in own if example["calls"]]
    direct = [turn_probabilities(model, example, call_token) for example in own if not example["calls"]]

    def mean(values: list[float]) -> float:
        return round(sum(values) / len(values), 4) if values else 1.0

    return ColdStartCheck(
        call=mean([first_turn for first_turn, _, _ in calling]),
        direct=mean([first_turn for first_turn, _, _ in direct]),
        call_share=mean([share for _, share, _ in calling + direct]),
        reading=mean([answer for _, _, answer in calling]) if reads else None,
    )


def turn_probabilities(model: PreTrainedModel, example: dict, call_token: int) -> tuple[float, float, float]:
    """For one demonstration: p(its first turn, the answer's own token left out), p(``call_token``, a call's first
    token, where the turn starts; 0 where no demonstration calls) and p(its answer token)."""
    batch = model_inputs(collate([example], model.config.get_text_config().pad_token_id or 0))
    hidden = model.model(**batch).last_hidden_state[0]
    labels = example["labels"]
    first_turn = first_labelled_run(labels)
    positions = [at for at in first_turn if at != example["answer_at"]]
    log_probs = model.lm_head(hidden[[at - 1 for at in positions]]).float().log_softmax(-1)
    turn = log_probs.gather(1, labels[positions][:, None]).sum().exp()
    starts = model.lm_head(hidden[first_turn[0] - 1]).float().softmax(-1)
    share = float(starts[call_token]) if call_token >= 0 else 0.0
    answer_at, answer_label = example["answer_at"], int(labels[example["answer_at"]])
    answer = model.lm_head(hidden[answer_at - 1]).float().softmax(-1)[answer_label] if answer_label >= 0 else 0.0
    return float(turn), share, float(answer)


def first_labelled_run(labels: torch.Tensor) -> list[int]:
    """The positions of the first run of labelled tokens (the first turn the model writes)."""
    labelled = (labels != -100).nonzero().flatten().tolist()
    run = labelled[:1]
    for at in labelled[1:]:
        if at != run[-1] + 1:
            break
        run.append(at)
    return run
