"""How a trajectory becomes training samples: the ``export`` option of the mm_tool loop.

- ``per_trajectory`` (default): one sample, the conversation as the loop built it: the first prompt, then every
  generated token (trained) and every tool or environment token (context) appended in order. What the model saw at
  turn k is exactly the sample's tokens before turn k. Cheapest; right whenever the chat template renders history
  as an extension of what it rendered before (every non-thinking Qwen-VL template).
- ``per_turn``: one sample per assistant turn. Before every turn after the first the loop renders the whole
  conversation with the chat template, as a chat server would at inference, and generates from that render. A turn's
  sample is that render (its prompt, every earlier image as its placeholder run) and the tokens generated in the turn
  (its response, with their rollout log-probs). Earlier assistant turns are rendered from their generated text
  (``history_view``), so the template sees what the model wrote, reasoning included, and drops what it drops:
  Qwen3-VL's Thinking templates render reasoning only for the turns after the last user query.
- ``auto``: one sample while the conversation stays prefix-stable, a new one where it does not. The rule, checked
  before every turn after the first: the text of the chat template's render of the conversation (images as one
  placeholder each) is compared with the text of the current sample (its image placeholder runs collapsed). Equal:
  the turn continues the sample, keeping the tokens the model generated (as verl's Continuous Token does). Different
  (the template rewrote history, e.g. dropped reasoning after an environment's user turn): the sample ends after its
  last generated token and a new one starts from the render, as in ``per_turn``.

Several samples need verl's v1 trainer (``trainer.use_v1=true``), whose agent-loop worker stores each sample of a
trajectory as ``{uid}_{session}_{index}``, copies the final sample's reward to the earlier ones and (GRPO) computes
advantages over each trajectory's final sample and broadcasts them (``verl.trainer.ppo.v1.utils``).
"""

from __future__ import annotations

EXPORTS = ("per_trajectory", "per_turn", "auto")


def history_view(messages: list[dict], assistant_texts: dict[int, str]) -> list[dict]:
    """The conversation with each generated assistant message (message index -> generated text) rendered from the
    text the model wrote: its tool calls and reasoning in place, as a chat server stores a model's reply."""
    return [
        {"role": "assistant", "content": assistant_texts[index]} if index in assistant_texts else message
        for index, message in enumerate(messages)
    ]


def collapse_runs(token_ids: list[int], run_token_ids: frozenset[int]) -> list[int]:
    """The ids with each run of one repeated placeholder token (an image's ``<|image_pad|>`` run) as one token: what
    a chat template writes for each image before the processor expands it."""
    collapsed: list[int] = []
    for token in token_ids:
        if not (token in run_token_ids and collapsed and collapsed[-1] == token):
            collapsed.append(token)
    return collapsed
