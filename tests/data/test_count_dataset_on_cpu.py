"""The count task (``make-data count``, the ``code`` recipe's data): rows in verl's layout whose answer is exactly
what the python tool's counting code prints in the sandbox, the code recipe's tool YAML loaded through verl, counts
cycling over 12-36, no validation picture in the training split."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pandas as pd
from PIL import Image

from verl_mm_tools.cli import main
from verl_mm_tools.data.count import COUNTS, PROMPT, RED, SQUARE, count_samples
from verl_mm_tools.workspace import ImageWorkspace, ToolContext, attach_tool_context

ROOT = Path(__file__).resolve().parents[2]
COUNTING = f"import numpy as np\nint((np.asarray(images[1]) == {RED}).all(-1).sum()) // {SQUARE * SQUARE}"


def test_make_data_count_writes_rows_whose_counts_cycle_and_splits_that_share_no_picture(tmp_path, capsys):
    assert main(["make-data", "count", "--out", str(tmp_path), "--train-size", "26", "--val-size", "4"]) == 0
    assert capsys.readouterr().out.splitlines() == [str(tmp_path / "train.parquet"), str(tmp_path / "val.parquet")]
    train, val = (pd.read_parquet(tmp_path / f"{split}.parquet") for split in ("train", "val"))
    assert [row["ground_truth"] for row in train["reward_model"]] == [*COUNTS, "12"]
    assert [row["ground_truth"] for row in val["reward_model"]] == ["12", "13", "14", "15"]
    assert train["prompt"][0][0]["content"] == PROMPT and set(train["agent_name"]) == {"mm_tool"}
    digests = {info["image_sha256"] for info in train["extra_info"]}
    assert len(digests) == 26 and digests.isdisjoint(info["image_sha256"] for info in val["extra_info"])
    image = Image.open(io.BytesIO(train["images"][0][0]["bytes"]))
    assert image.size == (448, 448) and image.mode == "RGB"


def test_the_code_recipes_python_tool_counts_every_picture_exactly():
    from verl.tools.tool_registry import load_all_tools

    [tool] = load_all_tools(str(ROOT / "examples" / "recipes" / "code" / "tools.yaml"), None)
    pictures = count_samples(3, seed=5)

    async def counted() -> list[str]:
        texts = []
        for picture in pictures:
            agent_data = type("AgentData", (), {})()
            attach_tool_context(agent_data, ToolContext(ImageWorkspace([picture.image]), None))
            instance_id, _ = await tool.create()
            try:
                response, _, _ = await tool.execute(instance_id, {"code": COUNTING}, agent_data=agent_data)
            finally:
                await tool.release(instance_id)
            texts.append(response.text)
        return texts

    assert asyncio.run(counted()) == [f"Output:\n{picture.label}" for picture in pictures]
    assert [picture.label for picture in pictures] == ["12", "13", "14"]
