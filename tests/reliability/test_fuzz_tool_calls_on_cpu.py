"""Fuzzed tool calls, as a model might write them: malformed JSON, wrong types, NaN/inf, huge and negative
coordinates, zero-area boxes, unknown tool names, missing and extra arguments.

- 10,000 calls through the tool layer (verl's hermes parser, then a real mm_tool loop's call execution and image
  admission): no exception escapes, every parsed call gets a text answer, every certainly-invalid call an error.
- 300 trajectories of fuzzed turns through verl's AgentLoopWorker: none is masked, every attempted call (parsed,
  malformed or over the parallel-call limit) is answered in the conversation, and the trajectory invariants hold.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from PIL import Image
from reliability_helpers import (
    image_tools,
    make_loop,
    marked_prompt,
    recorded,
    sample_tools_kwargs,
    trajectory_violations,
)
from verl.utils.ray_utils import get_event_loop

from verl_mm_tools.agent_loop.prompt import new_agent_data
from verl_mm_tools.agent_loop.state import TrajectoryState
from verl_mm_tools.tokens import VISION_TOKENS

TOOLS = image_tools()
PARAMETERS = {
    tool.name: {key: prop.type for key, prop in tool.tool_schema.function.parameters.properties.items()}
    for tool in TOOLS
}
REQUIRED = {tool.name: set(tool.tool_schema.function.parameters.required) for tool in TOOLS}
BOX_TOOLS = {"crop", "zoom_in", "draw_bbox"}
CHOICES = {"direction": ["horizontal", "vertical"], "color": ["red", "blue", "green"], "label": ["cat", ""]}
CALLS_PER_TURN = 10
TOOL_LAYER_TURNS = 1000  # x CALLS_PER_TURN = 10,000 fuzzed calls
FUZZ_BATCHES, TRAJECTORIES_PER_BATCH = 30, 10  # 300 fuzzed trajectories
# No shrinking: a failing example is printed whole, and shrinking ten-call turns can take minutes of CI time.
SETTINGS = dict(  # noqa: C408 - hypothesis settings read as keyword arguments
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)


nasty_numbers = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 5e-324, 1e308, -1e308, 2**63, -(2**63) - 1, 10**30]),
    st.integers(-(10**25), 10**25),
    st.floats(allow_nan=True, allow_infinity=True),
)
wrong_types = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=8),
    st.lists(st.integers(-9, 9), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
unknown_names = st.one_of(
    st.sampled_from(
        ["Rotate", "rotate ", "zoom", "crop_image", "", "image_zoom_in_tool", "python", "ROTATE", "rotate" * 60]
    ),
    st.text(max_size=12).filter(lambda name: name not in PARAMETERS),
)
prose = st.text(st.sampled_from("abc xyz 0123456789.,:;!?{}[]\"'\n\u00e9\u4e2d"), max_size=30)
EXTRA_KEYS = st.sampled_from(["bbox_2d", "angle", "image", "", "x1 ", "Degrees"])


def plausible(name: str, kind: str) -> st.SearchStrategy:
    if kind == "number":
        return st.one_of(st.integers(-20, 200), st.floats(-20, 200))
    if kind == "integer":
        return st.integers(-2, 6) if name == "image_id" else st.integers(-2, 40)
    return st.one_of(st.sampled_from(CHOICES.get(name, ["x"])), st.text(max_size=80))


def value_for(name: str, kind: str) -> st.SearchStrategy:
    """Mostly plausible values (repeated branches weight one_of), some hostile numbers, some wrong types."""
    good = plausible(name, kind)
    return st.one_of(good, good, good, good, good, good, good, nasty_numbers, wrong_types)


def arguments_strategy(tool_name: str, value: Callable[[str, str], st.SearchStrategy]) -> st.SearchStrategy[dict]:
    """A tool's arguments: the required ones (or, in one draw of four, any subset) and some optional ones."""
    parameters = PARAMETERS[tool_name]
    values = {name: value(name, kind) for name, kind in parameters.items()}
    complete = st.fixed_dictionaries(
        {name: values[name] for name in REQUIRED[tool_name]},
        optional={name: values[name] for name in parameters if name not in REQUIRED[tool_name]},
    )
    return st.one_of(complete, complete, complete, st.fixed_dictionaries({}, optional=values))


WELL_TYPED = {name: arguments_strategy(name, plausible) for name in PARAMETERS}
FUZZED = {name: arguments_strategy(name, value_for) for name in PARAMETERS}


@st.composite
def arguments_for(draw, tool_name: str) -> dict:
    """Well-typed or fuzzed arguments; ordered boxes most of the time, else zero-area or inverted ones; sometimes
    an extra key."""
    table = draw(st.sampled_from([WELL_TYPED, FUZZED]))
    arguments = dict(draw(table.get(tool_name, table["crop"])))
    box = {"x1", "x2", "y1", "y2"} <= set(arguments)
    geometry = draw(st.integers(0, 9))
    if box and geometry < 7:
        for low, high in (("x1", "x2"), ("y1", "y2")):
            if all(isinstance(arguments[key], (int, float)) for key in (low, high)):
                arguments[low], arguments[high] = sorted((arguments[low], arguments[high]), key=_sort_key)
    elif box and geometry < 9:
        axis = draw(st.sampled_from(["x", "y"]))
        arguments[f"{axis}2"] = arguments[f"{axis}1"]  # zero-area box, or a line along one axis
    if draw(st.integers(0, 14)) == 0:
        arguments[draw(EXTRA_KEYS)] = draw(wrong_types)
    return arguments


def _sort_key(value) -> float:
    if isinstance(value, float) and math.isnan(value):
        return -math.inf
    return float(value) if abs(value) < 1e300 else math.copysign(1e300, value)


TOOL_NAME = st.one_of(*[st.just(name) for name in sorted(PARAMETERS)] * 3, unknown_names)


@st.composite
def call_body(draw) -> str:
    """The text between <tool_call> and </tool_call>: valid JSON, oddly shaped JSON, or not JSON at all."""
    name = draw(TOOL_NAME)
    arguments = draw(arguments_for(name))
    shape = draw(st.integers(0, 19))
    if shape < 13:
        return json.dumps({"name": name, "arguments": arguments})
    if shape == 13:
        return json.dumps({"name": name, "arguments": json.dumps(arguments)})  # arguments as a JSON string
    if shape == 14:
        return json.dumps(
            {"name": name, "arguments": draw(st.one_of(st.lists(st.integers(), max_size=3), st.floats(), st.none()))}
        )
    if shape == 15:
        return json.dumps(
            {"name": draw(st.one_of(st.integers(), st.none(), st.lists(st.text(max_size=3)))), "arguments": {}}
        )
    if shape == 16:
        full = json.dumps({"name": name, "arguments": arguments})
        return full[: draw(st.integers(0, max(0, len(full) - 1)))]  # truncated
    if shape == 17:
        return repr({"name": name, "arguments": arguments})  # Python, not JSON
    if shape == 18:
        return (
            '{"name": "rotate", "arguments": {"degrees": '
            + draw(st.sampled_from(["1" * 5000, "[" * 3000, "NaN", "1e999"]))
            + "}}"
        )
    return draw(
        st.sampled_from(
            [
                "",
                "{",
                "[]",
                "null",
                '{"name": "rotate", "arguments": {"degrees": 90},}',
                "<tool_call>",
                '{"name": "flip"}',
            ]
        )
    )


def turn_text(bodies: list[str], words: str, unterminated: bool) -> str:
    calls = "".join(f"<tool_call>\n{body}\n</tool_call>" for body in bodies[:-1])
    last = f"<tool_call>\n{bodies[-1]}" if unterminated else f"<tool_call>\n{bodies[-1]}\n</tool_call>"
    return f"{words}{calls}{last}<|im_end|>"


@st.composite
def fuzzed_turn(draw, calls: int) -> str:
    """A turn of fuzzed calls. It never writes a vision token: hypothesis also draws strings found in the package's
    code (``<|vision_end|>``), and a turn generating one is masked on purpose (test_behaviour_on_cpu.py covers it)."""
    bodies = [draw(call_body()) for _ in range(calls)]
    text = turn_text(bodies, draw(prose), draw(st.integers(0, 9)) == 0)
    assume(not any(token in text for token in VISION_TOKENS))
    return text


# ----- what a certainly-invalid call is (judged from the parsed call alone) --------------------------------------


def certainly_invalid(name: str, raw_arguments: str) -> bool:
    if name not in PARAMETERS:
        return True
    try:
        arguments = json.loads(raw_arguments)
    except (TypeError, ValueError, RecursionError):
        return True
    if not isinstance(arguments, dict) or set(arguments) - set(PARAMETERS[name]):
        return True
    if any(arguments.get(key) is None for key in REQUIRED[name]):
        return True
    if any(_wrong_value(PARAMETERS[name][key], value) for key, value in arguments.items() if value is not None):
        return True
    return _degenerate_geometry(name, arguments)


def _wrong_value(kind: str, value) -> bool:
    if kind in ("number", "integer"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return True
        if isinstance(value, float) and (not math.isfinite(value) or (kind == "integer" and not value.is_integer())):
            return True
        return False
    return not isinstance(value, str)


def _degenerate_geometry(name: str, arguments: dict) -> bool:
    x1, y1, x2, y2 = (arguments.get(key) for key in ("x1", "y1", "x2", "y2"))
    if name in BOX_TOOLS:
        return x2 == x1 or y2 == y1
    return name == "draw_line" and x1 == x2 and y1 == y2


# ----- the tool layer: 10,000 calls ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tool_layer(tiny_model_dir, tmp_path_factory):
    # right-side truncation: an error must say what matters first, whatever the model wrote
    extra = ["actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=right"]
    return make_loop(
        tiny_model_dir, tmp_path_factory.mktemp("tool_layer"), tools=TOOLS, prompt_length=4096, extra=extra
    )


def run_sync(coroutine):
    return get_event_loop().run_until_complete(coroutine)  # verl's loop, as the harness uses


def answer_text(message: dict) -> str:
    content = message["content"]
    return content if isinstance(content, str) else content[-1]["text"]


async def run_turn(loop, text: str, images: list[Image.Image]) -> list[tuple[object, str, dict | None]]:
    """Parse one assistant turn and run its calls: (call, response, message) per parsed call, and the count of
    malformed calls the loop will answer with its notice."""
    state = TrajectoryState(files=loop.context.files)
    agent_data = await new_agent_data(loop.context, {"raw_prompt": marked_prompt(0, "fuzz", images)}, 0, state)
    token_ids = loop.tokenizer.encode(text, add_special_tokens=False)
    _, calls = await loop.tool_parser.extract_tool_calls(token_ids, agent_data._active_tool_schemas)
    answered = []
    for call in calls:
        response = (await loop.tool_runner.execute(call, state, agent_data)).response
        answered.append((call, response, loop.tool_runner.tool_message(call, response, state, agent_data)))
    return answered


def test_ten_thousand_fuzzed_calls_through_the_tool_layer_are_all_answered(tool_layer):
    counts = {"calls": 0, "parsed": 0, "images": 0, "errors": 0}
    sizes = st.tuples(st.integers(2, 300), st.integers(2, 300))  # hostile prompt images: test_hostile_images

    @settings(max_examples=TOOL_LAYER_TURNS, **SETTINGS)
    @given(text=fuzzed_turn(CALLS_PER_TURN), image_sizes=st.lists(sizes, min_size=0, max_size=2))
    def check(text, image_sizes):
        images = [Image.new("RGB", size, "gray") for size in image_sizes]
        answered = run_sync(run_turn(tool_layer, text, images))
        counts["calls"] += CALLS_PER_TURN
        counts["parsed"] += len(answered)
        for call, response, message in answered:
            reply = answer_text(message)
            assert isinstance(response.text, str) and response.text.strip() and reply.strip()
            assert "internally" not in response.text, response.text  # a tool failed on input it should explain
            if response.image:
                counts["images"] += 1
            else:
                counts["errors"] += 1
                assert response.text.startswith("Error"), response.text
            if certainly_invalid(call.name, call.arguments):
                assert not response.image and response.text.startswith("Error"), (call, response.text)
            if call.name not in PARAMETERS:  # the model learns which tools exist, however long the name it wrote
                assert "available tools: ['crop', 'draw_bbox', 'draw_line', 'flip', 'rotate', 'zoom_in']" in reply

    check()
    assert counts["calls"] >= 10_000
    assert counts["images"] > 100 and counts["errors"] > 3_000, counts  # the fuzzer reaches both outcomes


# ----- 300 fuzzed trajectories through verl's AgentLoopWorker --------------------------------------------------------

ANSWER = "<answer>3</answer><|im_end|>"
# Two tools per trajectory keep prompts short (each schema is ~150 tokens of the tiny tokenizer); calls to the
# other four are then unknown-tool calls, which the fuzzer wants anyway.
TOOL_SELECTION = st.lists(st.sampled_from(sorted(PARAMETERS)), min_size=1, max_size=2, unique=True)
MAX_PARALLEL_CALLS = 2


@pytest.fixture(scope="module")
def fuzz_worker(tiny_model_dir, tmp_path_factory):
    """One worker for every fuzzed batch (building one costs about a second)."""
    from reliability_helpers import LocalRollout, make_worker

    config = LocalRollout(tiny_model_dir, None, tmp_path_factory.mktemp("fuzz")).config(
        prompt_length=1024,
        response_length=1024,
        extra=[f"actor_rollout_ref.rollout.multi_turn.max_parallel_calls={MAX_PARALLEL_CALLS}"],
    )
    return make_worker(config, None)


def answered_calls(worker, generations) -> int:
    """Calls the loop must have answered: every <tool_call> of every turn the trajectory went on after."""
    return sum(worker.tokenizer.decode(g.token_ids).count("<tool_call>") for g in generations[:-1])


def test_three_hundred_fuzzed_trajectories_complete_unmasked_with_every_call_answered(fuzz_worker):
    from reliability_helpers import Batch, RecordingServer, generate, make_batch

    count = {"trajectories": 0, "responses": 0}

    @settings(max_examples=FUZZ_BATCHES, **SETTINGS)
    @given(
        scripts=st.lists(
            st.lists(st.integers(1, 3).flatmap(fuzzed_turn), min_size=1, max_size=2),
            min_size=TRAJECTORIES_PER_BATCH,
            max_size=TRAJECTORIES_PER_BATCH,
        ),
        selections=st.lists(TOOL_SELECTION, min_size=TRAJECTORIES_PER_BATCH, max_size=TRAJECTORIES_PER_BATCH),
    )
    def check(scripts, selections):
        tools, lifecycle = recorded(TOOLS)
        fuzz_worker.tools = tools
        server = RecordingServer(fuzz_worker.tokenizer, lambda sample, turn, images: (scripts[sample] + [ANSWER])[turn])
        fuzz_worker.llm_client = server
        prompts = [marked_prompt(index, "fuzz", [Image.new("RGB", (64, 48), "gray")]) for index in range(len(scripts))]
        columns = {
            "tools_kwargs": sample_tools_kwargs(tools, len(scripts)),
            "extra_info": [{"tool_selection": selection} for selection in selections],
        }
        batch = Batch(generate(fuzz_worker, make_batch(prompts, **columns)), server, fuzz_worker)
        assert list(batch.field("mm_tool/masked")) == [0] * len(scripts), batch.field("mm_tool/error")
        assert lifecycle.leaks() == []
        for index in range(len(scripts)):
            assert trajectory_violations(batch, index) == []
            response_text = fuzz_worker.tokenizer.decode(batch.output.batch["responses"][index])
            expected = answered_calls(fuzz_worker, server.generations[index])
            assert response_text.count("<tool_response>") == expected, (scripts[index], response_text)
            count["responses"] += expected
        count["trajectories"] += len(scripts)

    check()
    assert count["trajectories"] == FUZZ_BATCHES * TRAJECTORIES_PER_BATCH
