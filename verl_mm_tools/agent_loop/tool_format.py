"""How tools reach the model whatever its chat template.

The official Qwen2-VL and Qwen2.5-VL chat templates ignore ``tools`` and render a tool result as a plain ``tool``
turn, a role the model never saw in training; Qwen3-VL's renders the schemas in the system prompt and tool results as
``<tool_response>`` blocks in a user turn. Two mm_tool options adapt the conversation the template renders:

- ``tool_prompt``: ``template`` passes the schemas to the chat template; ``system`` adds the hermes tool block (the
  one Qwen's tool-aware templates render: schemas in ``<tools>``, calls as ``<tool_call>`` JSON, what verl's hermes
  parser reads) to the system message, inserting ``DEFAULT_SYSTEM_PROMPT`` when the sample has no system message;
  ``off`` does neither (the dataset's prompt describes the tools); ``auto`` is ``template`` when the template
  renders tool schemas, else ``system``.
- ``tool_response_role``: ``tool`` renders tool results as tool messages; ``user`` wraps each in
  ``<tool_response>`` inside one user turn per tool turn (text and images, in order); ``split`` keeps the results'
  text in tool messages and shows their images, in order, in one user turn after them (Gemma 4's template renders
  only the text of a tool message); ``auto`` is ``tool`` when the template has its own tool-role convention (renders
  a tool message other than as a plain role) and renders images in tool messages, ``split`` when it has the
  convention but drops those images, else ``user``.

The loop keeps the logical conversation (tool messages, for dumps and the viewer) and renders ``ToolFormat.view`` of
it, so the initial prompt and every appended turn use one format.
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from verl_mm_tools.agent_loop.options import ToolPrompt, ToolResponseRole
from verl_mm_tools.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, ProcessorMixin

# The Qwen2-VL / Qwen2.5-VL templates' default system prompt, used when the tool block needs a system message.
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
HERMES = "hermes"

_PROBE_TOOL = "mm_tool_template_probe"
_PROBE_SCHEMA = {
    "type": "function",
    "function": {"name": _PROBE_TOOL, "description": "probe", "parameters": {"type": "object", "properties": {}}},
}
_PROBE_TEXT = "mm_tool probe 7"


@dataclass(frozen=True)
class TemplateTraits:
    """What a chat template does with tools, found by rendering probe conversations."""

    renders_tools: bool  # the tool schemas passed as ``tools`` appear in the rendered prompt
    tool_role_convention: bool  # a tool message renders other than a plain ``tool`` role turn
    # a conversation renders as an extension of its render as generated and before the last user turn, for an
    # assistant turn with reasoning in it (False: Qwen3-VL Thinking's templates drop earlier reasoning, Gemma 4's the
    # empty thought channel of its generation prompt)
    prefix_stable: bool = True
    # an image in a tool message reaches the render (False: Gemma 4's template renders a tool message's text only)
    renders_tool_images: bool = True
    # a tool message renders after an assistant message without structured ``tool_calls`` (False: Gemma 4's template
    # renders tool results only from the calls that asked for them)
    renders_results_without_calls: bool = True


@dataclass(frozen=True)
class ToolFormat:
    """The resolved format: where the schemas go and which role carries tool results."""

    tool_prompt: ToolPrompt  # never AUTO
    response_role: ToolResponseRole  # never AUTO

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool_prompt", ToolPrompt(self.tool_prompt))
        object.__setattr__(self, "response_role", ToolResponseRole(self.response_role))

    def template_tools(self, schemas: list[dict]) -> list[dict] | None:
        """The ``tools`` argument of the chat template."""
        return schemas if self.tool_prompt is ToolPrompt.TEMPLATE and schemas else None

    def view(self, messages: list[dict], schemas: list[dict]) -> list[dict]:
        """The conversation as the chat template renders it."""
        if self.tool_prompt is ToolPrompt.SYSTEM and schemas:
            messages = with_tool_block(messages, schemas)
        if self.response_role is ToolResponseRole.USER:
            messages = tool_results_as_user_turns(messages)
        elif self.response_role is ToolResponseRole.SPLIT:
            messages = tool_images_after_tool_turns(messages)
        return messages


def resolve_tool_format(
    tool_prompt: ToolPrompt, response_role: ToolResponseRole, traits: TemplateTraits, parser: str
) -> ToolFormat:
    """The format for the configured options on this template (with tools configured); a ConfigError when they
    cannot work."""
    tool_prompt, response_role = ToolPrompt(tool_prompt), ToolResponseRole(response_role)
    if tool_prompt is ToolPrompt.AUTO:
        tool_prompt = ToolPrompt.TEMPLATE if traits.renders_tools else ToolPrompt.SYSTEM
        if tool_prompt is ToolPrompt.SYSTEM and parser != HERMES:
            raise ConfigError(
                f"the chat template ignores tool schemas, and mm_tool tool_prompt=auto can only add the hermes tool "
                f"block, but actor_rollout_ref.rollout.multi_turn.format={parser!r}. Set multi_turn.format=hermes, a "
                "custom chat template that renders tools (actor_rollout_ref.model.custom_chat_template), or mm_tool "
                "tool_prompt: off and describe the tools in the dataset's prompt."
            )
    elif tool_prompt is ToolPrompt.TEMPLATE and not traits.renders_tools:
        raise ConfigError(
            "mm_tool tool_prompt=template, but the chat template ignores the tool schemas (the official Qwen2-VL and "
            "Qwen2.5-VL templates do): the model would never see them. Set tool_prompt: auto or system (mm_tool adds "
            "them to the system message), or a chat template that renders tools."
        )
    if response_role is ToolResponseRole.AUTO:
        if not traits.tool_role_convention:
            response_role = ToolResponseRole.USER
        else:
            response_role = ToolResponseRole.TOOL if traits.renders_tool_images else ToolResponseRole.SPLIT
    elif response_role is ToolResponseRole.TOOL and not traits.renders_tool_images:
        raise ConfigError(
            "mm_tool tool_response_role=tool, but the chat template renders only the text of a tool message (Gemma "
            "4's does): every tool image would reach the processor without a placeholder in the text, and each "
            "trajectory with one would be masked. Set tool_response_role: auto or split (the images follow in a user "
            "turn), or user."
        )
    return ToolFormat(tool_prompt, response_role)


# ----- the tool block and tool results as user turns -----------------------------------------------------------


def system_tool_block(schemas: list[dict]) -> str:
    """The hermes tool block of Qwen's tool-aware templates."""
    signatures = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in schemas)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{signatures}\n</tools>"
        "\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
        "\n</tool_call>"
    )


def with_tool_block(messages: list[dict], schemas: list[dict]) -> list[dict]:
    """The messages with the tool block appended to the system message (one is inserted when there is none)."""
    block = system_tool_block(schemas)
    if not messages or messages[0].get("role") != "system":
        return [{"role": "system", "content": f"{DEFAULT_SYSTEM_PROMPT}\n\n{block}"}, *messages]
    system, content = messages[0], messages[0].get("content")
    if isinstance(content, str):
        content = f"{content}\n\n{block}"
    else:
        content = [*(content or []), {"type": "text", "text": f"\n\n{block}"}]
    return [{**system, "content": content}, *messages[1:]]


def tool_results_as_user_turns(messages: list[dict]) -> list[dict]:
    """Each run of consecutive tool messages as one user message of ``<tool_response>`` blocks, images in place."""
    result, run = [], []
    for message in [*messages, None]:
        if message is not None and message.get("role") == "tool":
            run.append(message)
            continue
        if run:
            result.append(_tool_results_turn(run))
            run = []
        if message is not None:
            result.append(message)
    return result


def tool_images_after_tool_turns(messages: list[dict]) -> list[dict]:
    """Each run of consecutive tool messages with their text only, then one user message of their images (in
    order) when they have any."""
    result, images = [], []
    for message in [*messages, None]:
        if message is not None and message.get("role") == "tool":
            content = _items(message.get("content"))
            images += [item for item in content if item.get("type") != "text"]
            texts = [item for item in content if item.get("type") == "text"]
            result.append({**message, "content": "".join(item["text"] for item in texts)})
            continue
        if images:
            result.append({"role": "user", "content": images})
            images = []
        if message is not None:
            result.append(message)
    return result


def _tool_results_turn(tool_messages: list[dict]) -> dict:
    items: list[dict] = []
    for index, message in enumerate(tool_messages):
        items += [
            _text("\n<tool_response>\n" if index else "<tool_response>\n"),
            *_items(message.get("content")),
            _text("\n</tool_response>"),
        ]
    joined: list[dict] = []
    for item in items:  # adjacent texts joined: a text-only turn becomes a plain string
        if item.get("type") == "text" and joined and joined[-1].get("type") == "text":
            joined[-1] = _text(joined[-1]["text"] + item["text"])
        else:
            joined.append(item)
    if all(item.get("type") == "text" for item in joined):
        return {"role": "user", "content": "".join(item["text"] for item in joined)}
    return {"role": "user", "content": joined}


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


def _items(content: str | Iterable[dict] | None) -> list[dict]:
    if content is None:
        return []
    return [_text(content)] if isinstance(content, str) else list(content)


# ----- probing a template --------------------------------------------------------------------------------------

# id(renderer) -> (weak reference to it, template kwargs, traits): verl builds a loop per trajectory
_TRAITS: dict[int, tuple[weakref.ref, str, TemplateTraits]] = {}


def template_traits(
    renderer: PreTrainedTokenizerBase | ProcessorMixin, template_kwargs: dict | None = None
) -> TemplateTraits:
    """Probe the chat template of ``renderer`` (the processor, or the tokenizer of a text model), once."""
    kwargs = dict(template_kwargs or {})
    key = json.dumps(kwargs, sort_keys=True, default=str)
    cached = _TRAITS.get(id(renderer))
    if cached is not None and cached[0]() is renderer and cached[1] == key:
        return cached[2]
    traits = _probe(renderer, kwargs)
    _TRAITS[id(renderer)] = (weakref.ref(renderer), key, traits)
    return traits


def _probe(renderer: PreTrainedTokenizerBase | ProcessorMixin, kwargs: dict) -> TemplateTraits:
    from verl.utils.tokenizer.chat_template import apply_chat_template

    def render(messages: list[dict], tools: list[dict] | None = None, generation: bool = True) -> str:
        text = apply_chat_template(
            renderer, messages, tokenize=False, add_generation_prompt=generation, tools=tools, **kwargs
        )
        return cast(str, text)  # tokenize=False: the text

    user: list[dict] = [{"role": "user", "content": _PROBE_TEXT}]
    renders_tools = _PROBE_TOOL in render(user, tools=[_PROBE_SCHEMA])
    prefix_stable = _prefix_stable(render, user)
    call = {"type": "function", "function": {"name": _PROBE_TOOL, "arguments": {}}}
    history: list[dict] = [*user, {"role": "assistant", "content": "", "tool_calls": [call]}]
    try:
        as_tool = render([*history, {"role": "tool", "content": _PROBE_TEXT}], generation=False)
    except Exception:  # noqa: BLE001 - a template that refuses the tool role has no convention for it
        return TemplateTraits(renders_tools, tool_role_convention=False, prefix_stable=prefix_stable)
    as_user = render([*history, {"role": "user", "content": _PROBE_TEXT}], generation=False)
    shared = len(os.path.commonprefix([as_tool, as_user]))
    # a plain-role template renders the tool turn exactly as a user turn with the role's name swapped
    plain = as_tool[shared:] == as_user[shared:].replace("user", "tool")
    with_image = [{"type": "image"}, {"type": "text", "text": _PROBE_TEXT}]
    as_text = [*user, {"role": "assistant", "content": "probe"}, {"role": "tool", "content": _PROBE_TEXT}]
    try:
        renders_tool_images = render([*history, {"role": "tool", "content": with_image}], generation=False) != as_tool
        without_calls = render(as_text, generation=False).count(_PROBE_TEXT) == 2
    except Exception:  # noqa: BLE001 - a template that refuses these probes: assume it renders them (as before)
        renders_tool_images = without_calls = True
    return TemplateTraits(renders_tools, not plain, prefix_stable, renders_tool_images, without_calls)


def _prefix_stable(render: Callable[..., str], user: list[dict]) -> bool:
    """Whether an answer with reasoning renders as it was generated (after the generation prompt) and the same once
    another user turn follows it."""
    answered = [*user, {"role": "assistant", "content": f"<think>\n{_PROBE_TEXT}\n</think>\n\n{_PROBE_TEXT}"}]
    before = render(answered, generation=False)
    # Gemma 4's generation prompt opens an empty thought channel its history render leaves out
    as_generated = before.startswith(render(user, generation=True))
    return as_generated and render([*answered, *user], generation=False).startswith(before)
