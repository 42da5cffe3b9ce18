"""Fixtures for the tool tests: verl AgentData holding images, and a synchronous ``execute``."""

import asyncio

import pytest
from PIL import Image

RED = (255, 0, 0)


def square_image(size=(64, 48), box=(8, 4, 24, 20)) -> Image.Image:
    """Black image with a red square at ``box``."""
    image = Image.new("RGB", size)
    image.paste(RED, box)
    return image


@pytest.fixture
def make_agent_data():
    """verl's real AgentData (as the tool_agent loop builds it) holding ``images``."""
    from verl.experimental.agent_loop.tool_agent_loop import AgentData

    def make(images):
        return AgentData(
            messages=[],
            image_data=images,
            video_data=None,
            audio_data=None,
            mm_processor_kwargs=None,
            metrics={},
            request_id="test",
            tools_kwargs={},
        )

    return make


@pytest.fixture
def execute():
    """``execute(tool, arguments, agent_data)`` -> (ToolResponse, reward, metrics), through create/release."""

    async def lifecycle(tool, arguments, agent_data):
        instance_id, _ = await tool.create()
        try:
            return await tool.execute(instance_id, arguments, agent_data=agent_data)
        finally:
            await tool.release(instance_id)

    return lambda tool, arguments, agent_data=None: asyncio.run(lifecycle(tool, arguments, agent_data))


@pytest.fixture
def two_images():
    """Image 1: a red square on black, 64x48; Image 2: plain gray, 40x30."""
    return [square_image(), Image.new("RGB", (40, 30), (128, 128, 128))]
