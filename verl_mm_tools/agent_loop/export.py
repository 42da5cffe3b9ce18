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
  Qwen3-VL's Thinking templates render reasoning only for the turns after the last user query. A template that
  renders tool results only from structured calls (Gemma 4's) gets the turns that called tools as verl parsed them
  (content and ``tool_calls``), as a chat server with a tool parser stores them.
- ``auto``: one sample while the conversation stays prefix-stable, a new one where it does not. The rule, checked
  before every turn after the first: the text of the chat template's render of the conversation (images as one
  placeholder each) is compared with the text of the current sample (its image placeholder runs collapsed). Equal:
  the turn continues the sample, keeping the tokens the model generated (as verl's Continuous Token does). Different
  (the template rewrote history, e.g. dropped reasoning after an environment's user turn): the sample ends after its
  last generated token and a new one starts from the render, as in ``per_turn``.

With ``keep_last_images: K`` every render above keeps only the trajectory's last K images, the earlier ones as a
note naming their id (``verl_mm_tools.image_window``); the sample holds just those images (``SampleCut.first_image``)
and the engine is sent just those. The window moves only where a sample starts, so each sample is the context the
model saw; ``auto`` (chosen when ``export`` is left unset) starts one exactly where an image leaves the context.

Several samples need verl's v1 trainer (``trainer.use_v1=true``), whose agent-loop worker stores each sample of a
trajectory as ``{uid}_{session}_{index}``, copies the final sample's reward to the earlier ones and (GRPO) computes
advantages over each trajectory's final sample and broadcasts them (``verl.trainer.ppo.v1.utils``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from verl_mm_tools.agent_loop.context import LoopContext
from verl_mm_tools.agent_loop.options import Export
from verl_mm_tools.agent_loop.state import SampleCut, TrajectoryState
from verl_mm_tools.errors import TrajectoryValidationError
from verl_mm_tools.image_window import images_left_out, windowed

if TYPE_CHECKING:
    from verl_mm_tools.agent_loop.agent_data import LoopAgentData


class Exporter:
    """Where a trajectory's training samples split (``export``), for one loop: before each turn after the first,
    whether the turn starts a new sample, and if so the new sample's tokens."""

    def __init__(self, context: LoopContext):
        self.context = context
        self.export = context.options.export
        # the placeholder runs ``auto`` collapses to compare the stream with the template's text
        self.placeholder_ids: frozenset[int] = frozenset()
        if self.export is Export.AUTO and context.sees_images and context.placeholder_ids:
            self.placeholder_ids = frozenset(found for found in context.placeholder_ids if found is not None)

    async def new_sample(self, agent_data: LoopAgentData, state: TrajectoryState) -> bool | None:
        """Before a turn after the first: True when a new sample starts, None when it would but the template's
        render of the conversation leaves no room to generate, False to continue the current sample."""
        if self.export is Export.PER_TRAJECTORY:
            return False
        if self.export is Export.AUTO and not await self._history_rewritten(agent_data, state):
            return False
        return await self._start_sample(agent_data, state) or None

    async def _history_rewritten(self, agent_data: LoopAgentData, state: TrajectoryState) -> bool:
        rendered = await self.context.run_in_executor(None, self._rendered_text, agent_data, state)
        stream = collapse_runs(agent_data.prompt_ids, self.placeholder_ids)
        return rendered != self.context.tokenizer.decode(stream, skip_special_tokens=False)

    def _left_out(self, agent_data: LoopAgentData) -> int:
        """The images the next sample leaves out of the context (``keep_last_images``)."""
        return images_left_out(len(agent_data.image_data), self.context.options.keep_last_images)

    def _history_messages(self, agent_data: LoopAgentData, state: TrajectoryState) -> list[dict]:
        """The conversation as the next sample renders it: every image but the window's as a note."""
        return windowed(rendered_history(self.context, agent_data, state), self._left_out(agent_data))

    def _rendered_text(self, agent_data: LoopAgentData, state: TrajectoryState) -> str:
        from verl.utils.tokenizer.chat_template import apply_chat_template

        context = self.context
        text = apply_chat_template(
            context.renderer,
            self._history_messages(agent_data, state),
            tokenize=False,
            add_generation_prompt=True,
            tools=context.tool_format.template_tools(agent_data._active_tool_schemas),
            **context.apply_chat_template_kwargs,
        )
        return cast(str, text)  # tokenize=False: the text

    async def _start_sample(self, agent_data: LoopAgentData, state: TrajectoryState) -> bool:
        """End the current sample after its last generated token and continue from the template's render of the
        whole conversation; False (nothing changed) when that render leaves no room to generate. The tokens after
        the first prompt's length count as the response, so the response budget and verl's own length checks hold
        for every sample, and a sample is never longer than prompt_length + response_length."""
        context = self.context
        mm_inputs: dict = {}
        tools = context.tool_format.template_tools(agent_data._active_tool_schemas)
        messages, left_out = self._history_messages(agent_data, state), self._left_out(agent_data)
        # the builder itself, not verl's ct_build_initial_tokens, which caps a prompt at rollout.prompt_length; its
        # token ids need each image's grid, not its pixels (the store's processor gives none; mm_inputs serves the
        # videos' payload only)
        rendered = await context.run_in_executor(
            None,
            lambda: context.build_initial_tokens(
                messages,
                tools=tools,
                images=agent_data.image_data[left_out:],
                videos=agent_data.video_data,
                audios=agent_data.audio_data,
                mm_inputs_out=mm_inputs,
            ),
        )
        history = len(rendered) - state.prompt_length
        if history < 0:
            raise TrajectoryValidationError(
                f"the chat template rendered the conversation in {len(rendered)} tokens, fewer than its first prompt "
                f"({state.prompt_length}): mm_tool export={self.export.value!r} cannot place it"
            )
        if history >= context.response_length:
            return False
        last = state.turns[-1]
        end = last.response_span[1]
        state.samples.append(
            SampleCut(
                agent_data.prompt_ids[: state.prompt_length + end],
                agent_data.response_mask[:end],
                list(agent_data.response_logprobs[:end]),
                last.images_before,
                last.routed_experts,
                first_image=state.first_image,
                videos=last.videos_before,
            )
        )
        state.first_image = left_out
        agent_data.prompt_ids = rendered
        agent_data.mm_processor_output = context.video_payload(agent_data.video_data, mm_inputs)
        agent_data.response_mask = [0] * history
        if agent_data.response_logprobs:
            agent_data.response_logprobs = [0.0] * history
        agent_data.routed_experts = None  # the engine returns the new sample's routing with its next generation
        return True


def rendered_history(context: LoopContext, agent_data: LoopAgentData, state: TrajectoryState) -> list[dict]:
    """The conversation as the chat template renders it at inference (and as the record's ``chat`` keeps it):
    generated turns from their text."""
    texts = {turn.message: turn.text for turn in state.turns if turn.message is not None}
    if not context.traits.renders_results_without_calls:
        texts = {index: text for index, text in texts.items() if not agent_data.messages[index].get("tool_calls")}
    return context.tool_format.view(history_view(agent_data.messages, texts), agent_data._active_tool_schemas)


def history_view(messages: list[dict], assistant_texts: dict[int, str]) -> list[dict]:
    """The conversation with each generated assistant message (message index -> generated text) rendered from the
    text the model wrote: its tool calls and reasoning in place, as a chat server stores a model's reply."""
    return [
        {"role": "assistant", "content": assistant_texts[index]} if index in assistant_texts else message
        for index, message in enumerate(messages)
    ]


def collapse_runs(token_ids: list[int], run_token_ids: frozenset[int]) -> list[int]:
    """The ids with each run of one repeated placeholder token (an image's ``<|image_pad|>`` or ``<|image|>`` run)
    as one token: what a chat template writes for each image before the processor expands it."""
    collapsed: list[int] = []
    for token in token_ids:
        if not (token in run_token_ids and collapsed and collapsed[-1] == token):
            collapsed.append(token)
    return collapsed
