"""An eval with the sandboxed python tool against a scripted endpoint: the model crops and plots with code, the
trajectory is written as records, and the viewer's page shows the code, the tool's output text and the images the
code returned, at the sizes the model saw them."""

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


@pytest.fixture(scope="module")
def python_eval(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("python_eval")
    question = (
        "row 0: <image>What is in the top-left corner? You may call the python tool. Answer as <answer>x</answer>."
    )
    data = write_parquet(
        [image_row("python_eval", question, sample_image(), "red", {"index": 0}, "mm_tool")], folder / "rows.parquet"
    )
    server = ScriptedChatServer(
        {0: [[api_call("python", json.dumps({"code": CODE}))], [answer("<answer>red</answer>")]]}
    )
    options = EvalOptions(
        data=data,
        out=folder / "out",
        model_path=str(tiny_model_dir),
        tools_yaml=YAML,
        reward_fn="exact_answer_reward",
        batch_size=1,
        max_turns=3,
        response_length=512,
    )
    with server.running() as url:
        settings = EndpointSettings(url=url, model="tiny", concurrency=1, timeout_s=30, retries=0, backoff_s=0)
        report = evaluate(options, lambda tokenizer: EndpointClient(settings, tokenizer))
    return report, folder / "out", server


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
