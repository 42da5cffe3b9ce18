"""An eval with the sandboxed python tool against a scripted endpoint: the model crops and plots with code, the
trajectory is written as records, and the viewer's page shows the code, the tool's output text and the images the
code returned, at the sizes the model saw them. With ``on_error: end`` a failed call ends the trajectory: its record
(not masked, stop reason tool_failed, the call's answer last), the eval report and the viewer say so."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from chat_servers import ScriptedChatServer, answer, api_call
from PIL import Image

from verl_mm_tools.data.common import image_row, write_parquet
from verl_mm_tools.evaluate.endpoint import EndpointClient, EndpointSettings
from verl_mm_tools.evaluate.run import TOOLS, EvalOptions, evaluate
from verl_mm_tools.record import RECORD_FILE
from verl_mm_tools.testkit.sample_dump import sample_image
from verl_mm_tools.viewer.site import build_site

YAML = Path(__file__).resolve().parents[2] / "examples" / "tools" / "python_tool.yaml"
CODE = (
    "crop = images[1].crop((0, 0, 32, 24))\n"
    "crop.save('crop.png')\n"
    "import numpy as np, matplotlib.pyplot as plt\n"
    "plt.figure(figsize=(2, 2), dpi=32)\n"
    "plt.hist(np.asarray(crop)[..., 0].ravel(), bins=8)\n"
    "print('red mean', round(float(np.asarray(crop)[..., 0].mean()), 1))"
)


def run_eval(folder: Path, tiny_model_dir, tools_yaml: Path, script: list[list]):
    """One row (a red-cornered sample image) evaluated with ``tools_yaml`` against a chat endpoint answering
    ``script``; returns the report, the output folder and the server (its ``requests``)."""
    question = (
        "row 0: <image>What is in the top-left corner? You may call the python tool. Answer as <answer>x</answer>."
    )
    data = write_parquet(
        [image_row("python_eval", question, sample_image(), "red", {"index": 0}, "mm_tool")], folder / "rows.parquet"
    )
    server = ScriptedChatServer({0: script})
    options = EvalOptions(
        data=data,
        out=folder / "out",
        model_path=str(tiny_model_dir),
        tools_yaml=tools_yaml,
        reward_fn="exact_answer_reward",
        batch_size=1,
        max_turns=3,
        response_length=512,
    )
    with server.running() as url:
        settings = EndpointSettings(url=url, model="tiny", concurrency=1, timeout_s=30, retries=0, backoff_s=0)
        report = evaluate(options, lambda tokenizer: EndpointClient(settings, tokenizer))
    return report, folder / "out", server


@pytest.fixture(scope="module")
def python_eval(tiny_model_dir, tmp_path_factory):
    script = [[api_call("python", json.dumps({"code": CODE}))], [answer("<answer>red</answer>")]]
    return run_eval(tmp_path_factory.mktemp("python_eval"), tiny_model_dir, YAML, script)


def test_the_page_shows_the_code_its_output_and_its_images(python_eval):
    _, out, server = python_eval
    site = build_site(out / TOOLS / "trajectories", out / "site")
    [page] = site.pages.values()
    text = page.read_text(encoding="utf-8")
    assert f'<div class="call"><b>python</b><pre class="code"><code>{html.escape(CODE)}</code></pre></div>' in text
    assert "Image 2: saved to crop.png, 32x24 px." in text
    assert "Image 3: matplotlib figure 1, 64x64 px." in text
    assert re.search(r"Output:\s*red mean \d", text)
    sources = re.findall(r'<img[^>]* src="([^"]+)"', text)
    images = [Image.open(page.parent / source) for source in sources]
    # the prompt image, the crop and the figure as the model saw them (the processor's sizes: multiples of 28)
    assert [image.size for image in images] == [(56, 84), (28, 28), (56, 56)]
    assert images[2].convert("RGB").getpixel((0, 0)) == (255, 255, 255)  # the figure's white margin


FAILING_CODE = "print('cropping')\n1 / 0"
# the kernel's answer to a failed call: what it printed, then the traceback
FAILED_ANSWER = (
    "Error:\ncropping\nTraceback (most recent call last):\n"
    '  File "<code>", line 2, in <module>\nZeroDivisionError: division by zero'
)


@pytest.fixture(scope="module")
def ended_eval(tiny_model_dir, tmp_path_factory):
    """With on_error: end the first call fails, so the trajectory ends at its answer: the scripted answer after it
    is never asked for."""
    folder = tmp_path_factory.mktemp("ended_eval")
    tools_yaml = folder / "tools.yaml"
    tools_yaml.write_text(YAML.read_text().replace("on_error: answer", "on_error: end"))
    script = [[api_call("python", json.dumps({"code": FAILING_CODE}))], [answer("<answer>red</answer>")]]
    return run_eval(folder, tiny_model_dir, tools_yaml, script)


def test_a_call_that_ends_the_trajectory_is_its_records_last_message_and_its_stop_reason(ended_eval):
    report, out, server = ended_eval
    [path] = (out / TOOLS / "trajectories").rglob(RECORD_FILE)
    record = json.loads(path.read_text())
    assert (record["stop_reason"], record["masked"], record["error"]) == ("tool_failed", False, "")
    assert [message["role"] for message in record["messages"]] == ["user", "assistant", "tool"]
    assert record["messages"][-1] == {
        "role": "tool",
        "turn": 1,
        "text": FAILED_ANSWER,
        "image_ids": [],
        "tool_call_id": None,
        "error": True,
    }
    # the call the model wrote trains; the failed call's answer after it is context
    mask, [turn] = record["mask"], record["turns"]
    assert mask["trained_tokens"] == turn["trained_tokens"] > 0
    assert mask["context_tokens"] == turn["context_tokens_after"] > 0
    assert mask["response_tokens"] == mask["trained_tokens"] + mask["context_tokens"]
    figures = report["modes"][TOOLS]["python_eval"]
    assert figures["stop_reasons"] == {
        "answered": 0,
        "turn_limit": 0,
        "length_limit": 0,
        "budget": 0,
        "tool_failed": 1,
        "episode_done": 0,
        "error": 0,
    }
    assert (figures["masked"], figures["turns_per_trajectory"], len(server.requests)) == (0, 1.0, 1)


def test_the_viewer_shows_the_stop_reason_and_the_failed_calls_answer(ended_eval):
    _, out, _ = ended_eval
    site = build_site(out / TOOLS / "trajectories", out / "site")
    [page] = site.pages.values()
    text = page.read_text(encoding="utf-8")
    assert "<dt>Stop reason</dt><dd>tool_failed</dd><dt>Masked</dt><dd>false</dd>" in text
    code_block = f'<pre class="code"><code>{html.escape(FAILING_CODE)}</code></pre>'
    assert f'<div class="call"><b>python</b>{code_block}</div>' in text
    assert html.escape(FAILED_ANSWER) in text
    index = site.index.read_text(encoding="utf-8")
    assert '<option value="tool_failed">tool_failed</option>' in index  # the index's stop-reason filter
    assert "<td>python</td><td>tool_failed</td>" in index
