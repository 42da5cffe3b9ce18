"""The ``python`` tool through verl's tool classes: check_tool, the example YAML through verl's loader, exact answers
(ids, texts, pixels), a session per trajectory, errors and time-outs as text, release, a remote actor's host (in
this process, no Ray), and a trajectory of the real mm_tool loop whose next prompt holds the image the code saved."""

from __future__ import annotations

import asyncio
import functools
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.remote.host import TOOL, RemoteHost
from verl_mm_tools.runtime.batch import image_prompt, unpadded_row
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.runtime.scripted_client import tool_call_text
from verl_mm_tools.sandbox import RunResult
from verl_mm_tools.step_metrics import aggregate_metrics
from verl_mm_tools.testkit.rows import marked_image
from verl_mm_tools.tools import PythonTool, check_tool
from verl_mm_tools.tools.base import END_TRAJECTORY
from verl_mm_tools.tools.python_tool import LOST_SESSION
from verl_mm_tools.workspace import ImageWorkspace, ToolContext, attach_tool_context

YAML = Path(__file__).resolve().parents[2] / "examples" / "tools" / "python_tool.yaml"
CROP = "images[1].crop((8, 4, 24, 20)).save('crop.png')"


def calls(tool, arguments_list, agent_data):
    """Each arguments dict executed in order on ONE session of ``tool`` (create, executes, release)."""

    async def session():
        instance_id, _ = await tool.create()
        try:
            return [await tool.execute(instance_id, arguments, agent_data=agent_data) for arguments in arguments_list]
        finally:
            await tool.release(instance_id)

    return asyncio.run(session())


def test_check_tool_passes():
    report = check_tool(PythonTool)
    assert "15 checks passed" in str(report)


def test_the_example_yaml_loads_through_verls_loader():
    from verl.tools.tool_registry import load_all_tools

    [tool] = load_all_tools(str(YAML), None)
    assert isinstance(tool, PythonTool) and tool.name == "python"
    assert (tool.limits.timeout_s, tool.limits.memory_mb, tool.limits.max_images) == (10, 2048, 8)
    assert tool.settings.sandbox == "bwrap" and tool.settings.max_pixels == 1003520
    assert list(tool.tool_schema.function.parameters.properties) == ["code"]


def test_a_saved_crop_comes_back_as_the_next_image_with_its_pixels(make_agent_data, two_images):
    agent_data = make_agent_data(two_images)
    [(response, reward, metrics)] = calls(PythonTool(), [{"code": CROP}], agent_data)
    assert response.text == "Image 3: saved to crop.png, 16x16 px."
    assert (reward, metrics) == (0.0, {})
    [image] = response.image
    assert np.array_equal(np.asarray(image), np.asarray(two_images[0])[4:20, 8:24])
    assert (np.asarray(image) == (255, 0, 0)).all()
    assert len(agent_data.image_data) == 2  # the loop, not the tool, adds the image


PLOT = (
    "import matplotlib.pyplot as plt\n"
    "fig = plt.figure(figsize=(2, 1), dpi=50)\n"
    "ax = fig.add_axes((0, 0, 1, 1))\n"
    "ax.axis('off')\n"
    "ax.add_patch(plt.Rectangle((0, 0), 0.5, 1, color=(1, 0, 0)))\n"
    "fig.savefig('plot.png')\n"
    "plt.figure(figsize=(1, 1), dpi=20)\n"
    "import os\n"
    "sorted(os.listdir('.')), sorted(os.listdir('.matplotlib'))"
)


def test_a_matplotlib_figure_comes_back_as_an_image_with_its_pixels(make_agent_data, two_images):
    """A figure saved with savefig comes back once, one left open comes back too; Agg only, its font cache written in
    the work directory (MPLCONFIGDIR), nothing outside."""
    [(response, _, metrics)] = calls(PythonTool(), [{"code": PLOT}], make_agent_data(two_images))
    assert response.text == (
        "Image 3: saved to plot.png, 100x50 px.\n"
        "Image 4: matplotlib figure 2, 20x20 px.\n"
        "Output:\n(['.matplotlib', 'image_1.png', 'image_2.png', 'plot.png'], ['fontlist-v3.11.0.json'])"
    )
    saved, empty = (np.asarray(image) for image in response.image)
    assert saved.shape == (50, 100, 3) and metrics == {}
    # the red half and the white half, exactly, inside the antialiased edges
    assert (saved[2:48, 2:48] == (255, 0, 0)).all() and (saved[:, 51:] == (255, 255, 255)).all()
    assert (empty == (255, 255, 255)).all()


def test_state_lives_in_one_trajectory_only(make_agent_data, two_images):
    tool = PythonTool()
    agent_data = make_agent_data(two_images)
    first, second = calls(tool, [{"code": "total = images[2].size[0]"}, {"code": "total * 2"}], agent_data)
    assert (first[0].text, second[0].text) == ("Done (no output, no image).", "Output:\n80")
    [(other, _, metrics)] = calls(tool, [{"code": "total"}], agent_data)
    assert other.text.startswith("Error:\nTraceback") and other.text.endswith("NameError: name 'total' is not defined")
    assert metrics == {"error": "NameError: name 'total' is not defined"}
    assert tool.kernels == {}  # every session released


def test_large_images_are_downscaled_to_max_pixels_and_limits_are_noted(make_agent_data, two_images):
    tool = PythonTool({"type": "native", "max_pixels": 40000, "limits": {"max_images": 1}})
    code = "Image.new('RGB', (400, 400), (0, 0, 255)).save('blue.png')\nimages[2].show()\nprint('two')"
    [(response, _, metrics)] = calls(tool, [{"code": code}], make_agent_data(two_images))
    assert response.text == (
        "Image 3: saved to blue.png, 200x200 px (downscaled from 400x400).\n"
        "Output:\ntwo\n"
        "Note: an image shown was not returned: at most 1 per call."
    )
    assert response.image[0].getpixel((100, 100)) == (0, 0, 255) and metrics == {}


SHOWN = [(Image.new("RGB", (8, 8)), "shown")]


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (RunResult(output="x" * 40 + "\n"), "Output:\n" + "x" * 40),
        (
            RunResult(output="x" * 200, images=SHOWN, refused=["n1"], more_refused=3),
            "Image 2: shown, 8x8 px.\nOutput:\n"
            + "x" * 7
            + "\n... (193 more characters of output were cut)\nNote: n1; 3 more images were not returned.",
        ),
        (RunResult(output="y" * 10, cut=5), "Output:\n" + "y" * 10 + "\n... (5 more characters of output were cut)"),
        (
            RunResult(lost="the kernel exited (status 3) during the call", refused=["n" * 300] * 5),
            "Error: the kernel exited (status 3) during the call. The Python session was restarted"
            "\n... (the answer was cut at 128 characters)",
        ),
        (RunResult(output="\ud800\x00", failed=True), "Error:\n\ufffd\ufffd"),
    ],
    ids=["fits", "output-cut-for-the-notes", "kernel-cut-counted", "notes-too-long", "not-valid-text"],
)
def test_the_whole_answer_is_valid_text_within_max_output_chars(result, expected):
    tool = PythonTool({"type": "native", "limits": {"max_output_chars": 128}})
    response, _, _ = tool._answer(result, next_id=2)
    assert response.text == expected
    assert len(response.text) <= 128


def test_a_time_out_is_answered_as_text_and_the_session_restarts(make_agent_data, two_images):
    tool = PythonTool({"type": "native", "limits": {"timeout_s": 1}})
    codes = [{"code": "kept = 1"}, {"code": "while True:\n    pass"}, {"code": "kept"}]
    _, (lost, _, metrics), (after, _, _) = calls(tool, codes, make_agent_data(two_images))
    assert lost.text == f"Error: the call ran longer than 1 s and was stopped. {LOST_SESSION}"
    assert metrics == {"error": "the call ran longer than 1 s and was stopped"}
    assert after.text.endswith("NameError: name 'kept' is not defined")


def test_release_ends_the_kernel(make_agent_data, two_images):
    tool = PythonTool()

    async def session():
        instance_id, _ = await tool.create()
        await tool.execute(instance_id, {"code": "1"}, agent_data=make_agent_data(two_images))
        pid = tool.kernels[instance_id].process.pid
        await tool.release(instance_id)
        return pid

    pid = asyncio.run(session())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"sandbox": "docker"}, "sandbox must be one of ['bwrap', 'none'], got 'docker'"),
        ({"limits": {"memory": 1}}, "unknown sandbox limit 'memory'. Did you mean 'memory_mb'?"),
        ({"packages": ["numpy", "no_such_module"]}, "'no_such_module', which is not installed"),
        ({"bwrap": "no-such-bwrap"}, "'no-such-bwrap' is not on PATH"),
        ({"sandboxx": "none"}, "unknown config key 'sandboxx'. Did you mean 'sandbox'?"),
        ({"on_error": "raise"}, "on_error must be one of ['answer', 'end'], got 'raise'"),
    ],
)
def test_config_errors_say_what_to_fix(config, message):
    with pytest.raises(ConfigError) as error:
        PythonTool({"type": "native", **config})
    assert message in str(error.value)


def test_a_remote_actors_host_serves_the_tool(two_images):
    """The ``remote:`` path without Ray: the actor's RemoteHost, in this process, with the images it is sent."""
    host = RemoteHost(TOOL, PythonTool, {"config": {"type": "native"}, "tool_schema": None})
    host.create("trajectory", {})
    try:
        response, _, _ = host.execute("trajectory", {"code": "size = images[1].size\nsize"}, 0, two_images, None)
        assert response.text == "Output:\n(64, 48)"
        response, _, _ = host.execute("trajectory", {"code": CROP}, 2, [], None)
        assert response.text == "Image 3: saved to crop.png, 16x16 px."
        assert host.execute("trajectory", {"code": "size"}, 2, [], None)[0].text == "Output:\n(64, 48)"
    finally:
        host.release("trajectory", {})
    assert host.tool.kernels == {}


def test_the_mm_tool_loop_shows_the_model_the_image_its_code_saved(tiny_model_dir, tmp_path):
    tools_yaml = tmp_path / "tools.yaml"
    tools_yaml.write_text(YAML.read_text())
    code = "crop = images[1].crop((0, 0, 28, 28))\ncrop.save('red.png')\nprint(crop.getpixel((3, 3)))"
    turns = [tool_call_text("python", code=code), "<answer>red</answer><|im_end|>"]
    output, server, worker = LocalRollout(tiny_model_dir, tools_yaml, tmp_path).run(
        turns, [image_prompt("What color is the top-left corner?", [marked_image()])]
    )
    prompt_image, crop = server.requests[1]["images"]
    assert server.requests[0]["images"] == [prompt_image]
    assert crop.size == (28, 28)
    assert np.array_equal(np.asarray(crop), np.asarray(prompt_image)[:28, :28])
    assert (np.asarray(crop) == (255, 0, 0)).all()
    seen = worker.tokenizer.decode(server.requests[1]["prompt_ids"])
    assert "Image 2: saved to red.png, 28x28 px.\nOutput:\n(255, 0, 0)" in seen
    assert list(output.non_tensor_batch["tool_call_counts"]) == [1]


def test_an_image_workspace_of_the_loop_gives_the_ids(two_images):
    """Under the mm_tool loop the tool reads the loop's workspace (attached to AgentData), as the image tools do."""
    agent_data = type("AgentData", (), {})()
    attach_tool_context(agent_data, ToolContext(ImageWorkspace([*two_images, Image.new("RGB", (2, 2))]), None))
    [(response, _, _)] = calls(PythonTool(), [{"code": "len(images), images[3].size"}], agent_data)
    assert response.text == "Output:\n(3, (2, 2))"


@pytest.mark.parametrize("on_error", ["answer", "end"])
def test_a_failed_call_is_answered_alike_and_with_on_error_end_asks_to_end_the_trajectory(
    make_agent_data, two_images, on_error
):
    """The same answer either way; ``end`` adds END_TRAJECTORY to a failed call's metrics only, and the flag crosses
    a remote actor's host as data."""
    tool = PythonTool({"type": "native", "on_error": on_error})
    failed, fine = calls(tool, [{"code": "1 / 0"}, {"code": "2"}], make_agent_data(two_images))
    assert failed[0].text == (
        'Error:\nTraceback (most recent call last):\n  File "<code>", line 1, in <module>\n'
        "ZeroDivisionError: division by zero"
    )
    ends = {END_TRAJECTORY: True} if on_error == "end" else {}
    assert failed[2] == {"error": "ZeroDivisionError: division by zero", **ends}
    assert (fine[0].text, fine[2]) == ("Output:\n2", {})
    host = RemoteHost(TOOL, PythonTool, {"config": {"type": "native", "on_error": on_error}, "tool_schema": None})
    host.create("trajectory", {})
    try:
        assert host.execute("trajectory", {"code": "1 / 0"}, 0, two_images, None)[2] == failed[2]
    finally:
        host.release("trajectory", {})


FAILED_CALL_ANSWER = (
    "\n<|im_start|>user\n<tool_response>\nError:\nTraceback (most recent call last):\n"
    '  File "<code>", line 1, in <module>\nZeroDivisionError: division by zero\n</tool_response><|im_end|>\n'
    "<|im_start|>assistant\n"
)


@pytest.mark.parametrize("on_error", ["answer", "end"])
def test_a_failing_call_is_answered_or_ends_the_trajectory_as_configured(tiny_model_dir, tmp_path, on_error):
    """Through the real mm_tool loop: by default the model reads the error and answers; with on_error: end the
    trajectory ends at the failed call's answer (stop reason tool_failed), trains on the call the model generated
    (nothing masked), and its kernel is released."""
    tools_yaml = tmp_path / "tools.yaml"
    tools_yaml.write_text(YAML.read_text().replace("on_error: answer", f"on_error: {on_error}"))
    call, answer = tool_call_text("python", code="1 / 0"), "<answer>none</answer><|im_end|>"
    output, server, worker = LocalRollout(tiny_model_dir, tools_yaml, tmp_path).run(
        [call, answer], [image_prompt("Divide.", [marked_image()])]
    )
    [tool] = worker.tools
    assert tool.settings.on_error == on_error and tool.kernels == {}
    assert (output.non_tensor_batch["mm_tool/masked"][0], output.non_tensor_batch["mm_tool/error"][0]) == (0, "")
    encode = functools.partial(worker.tokenizer.encode, add_special_tokens=False)
    row = unpadded_row(output)
    # the failed call's answer is context either way; with on_error: end nothing is generated after it
    called, told, answered = encode(call), encode(FAILED_CALL_ANSWER), encode(answer) if on_error == "answer" else []
    assert row["response_ids"] == called + told + answered
    assert row["response_mask"] == [1] * len(called) + [0] * len(told) + [1] * len(answered)
    stop, generations = ("tool_failed", 1) if on_error == "end" else ("answered", 2)
    assert (output.non_tensor_batch["mm_tool/stop_reason"][0], len(server.requests)) == (stop, generations)
    # verl's count: the prompt, each generation and the tool's answer (the last message with on_error: end)
    assert (output.non_tensor_batch["__num_turns__"][0], output.non_tensor_batch["mm_tool/turns"][0]) == (
        generations + 2,
        generations,
    )
    metrics = aggregate_metrics(SampleFields.every_row(output.non_tensor_batch))
    assert (metrics["mm_tool/stop/tool_failed"], metrics["mm_tool/stop/error"]) == (float(on_error == "end"), 0.0)
    assert metrics["mm_tool/tool/python/error_rate"] == 1.0
