"""Hypothesis: whatever arguments a model writes, every tool answers (never raises), refusals are text only, and
no returned image exceeds the configured max_pixels."""

import asyncio
import types

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from PIL import Image
from verl.tools.schemas import ToolResponse

from verl_mm_tools.ops import MIN_MAX_PIXELS
from verl_mm_tools.tools import BUILTIN_TOOLS

pytestmark = pytest.mark.integration  # verl's tool loader over every tool

CONFIG = {"type": "native", "max_pixels": MIN_MAX_PIXELS}  # small, so zooms (target 448) hit the cap
EXTRA_KEYS = ["bogus", "image", "angle", "bbox_2d", ""]

hostile = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**40), 10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.lists(st.integers(-5, 500), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def valid(name: str, prop) -> st.SearchStrategy:
    """Values of the right type, mostly in range (coordinates may still fall off the image)."""
    if prop.enum:
        return st.sampled_from(prop.enum)
    if prop.type == "number":
        return st.one_of(st.floats(-50, 350), st.integers(-50, 350))
    if prop.type == "integer":
        return st.sampled_from([1, 2]) if name == "image_id" else st.integers(1, 32)
    return st.text(max_size=64)


def near(name: str, prop) -> st.SearchStrategy:
    """Values just outside the valid range, or hostile."""
    if prop.enum:
        wrong = st.sampled_from(["Red", "diagonal", "", "horizontally"])
    elif prop.type == "number":
        wrong = st.sampled_from([720, -361, 1e9, -1e300, 1e-300, 2**63])
    elif prop.type == "integer":
        wrong = st.sampled_from([-1, 0, 3, 33, 2.5, 10**30])
    else:
        wrong = st.text(min_size=65, max_size=100)
    return st.one_of(wrong, hostile)


@st.composite
def good_call(draw, properties, required) -> dict:
    """A well-typed call; box and line coordinates come ordered (x1 < x2, y1 < y2) near the image."""
    arguments = {name: draw(valid(name, prop)) for name, prop in properties.items() if name in required}
    for name, prop in properties.items():
        if name not in required and draw(st.booleans()):
            arguments[name] = draw(valid(name, prop))
    if {"x1", "x2", "y1", "y2"} <= set(arguments):
        for low, high in (("x1", "x2"), ("y1", "y2")):
            arguments[low] = draw(st.integers(-20, 60))
            arguments[high] = arguments[low] + draw(st.one_of(st.integers(1, 200), st.floats(0.5, 200)))
    return arguments


@st.composite
def one_bad_call(draw, properties, required) -> dict:
    """A good call with one value replaced by an out-of-range or hostile one."""
    name = draw(st.sampled_from(sorted(properties)))
    return {**draw(good_call(properties, required)), name: draw(near(name, properties[name]))}


def arguments_for(tool) -> st.SearchStrategy:
    """Well-typed calls, calls with one bad value, and dicts of random keys and hostile values."""
    properties = tool.tool_schema.function.parameters.properties
    required = tool.tool_schema.function.parameters.required
    keys = st.sampled_from([*properties, *EXTRA_KEYS])
    choices = [
        good_call(properties, required),
        one_bad_call(properties, required),
        st.dictionaries(keys, hostile, min_size=1, max_size=len(properties) + 1),
    ]
    return st.sampled_from([0, 0, 0, 1, 2]).flatmap(lambda i: choices[i])  # 3/5 well-typed calls


def images() -> st.SearchStrategy:
    sizes = st.tuples(st.integers(1, 300), st.integers(1, 300))
    return sizes.map(lambda size: [Image.new("RGB", (64, 48), "white"), Image.new("RGB", size, "gray")])


@pytest.mark.parametrize("tool_cls", BUILTIN_TOOLS, ids=lambda cls: cls.__name__)
def test_tools_always_answer_within_budget(tool_cls):
    tool = tool_cls(config=CONFIG, tool_schema=None)

    @settings(max_examples=50, deadline=None)
    @given(arguments=arguments_for(tool), workspace_images=images())
    def check(arguments, workspace_images):
        agent_data = types.SimpleNamespace(image_data=list(workspace_images))
        result = asyncio.run(tool.execute("instance", arguments, agent_data=agent_data))
        response, reward, metrics = result
        assert isinstance(response, ToolResponse) and reward == 0.0 and isinstance(metrics, dict)
        assert len(agent_data.image_data) == 2
        event("answered with an image" if response.image else "refused")
        if response.image:
            [image] = response.image
            assert image.width * image.height <= MIN_MAX_PIXELS
            assert response.text.startswith("Image 3: Image ")
            assert response.text.endswith(f", {image.width}x{image.height} px.")
            assert metrics == {}
        else:
            assert response.text == f"Error from {tool.name}: {metrics['error']}"
            assert "internally" not in response.text  # every refusal is an explained input error

    check()
