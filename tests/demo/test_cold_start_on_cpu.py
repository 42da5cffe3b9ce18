"""The SFT warm start's data (``demo --sft-warm-start``): demonstrations recorded by the mm_tool loop and written by
export-sft are the custom warm start's demonstrations, token for token, as verl's SFT dataset reads them. (verl's
SFT trainer itself runs in tests/cpu/test_verl_sft_on_cpu.py.)"""

from __future__ import annotations

import pytest
from transformers import AutoProcessor

from verl_mm_tools.demo.cold_start import ColdStartSpec, record_and_export
from verl_mm_tools.demo.demonstrations import demonstrations
from verl_mm_tools.demo.format_tasks import WarmStartSpec
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

COUNT = 8


def test_the_exported_demonstrations_are_the_custom_warm_starts_token_for_token(tiny_model_dir, tmp_path):
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    (tmp_path / "tools.yaml").write_text(ROTATE_TOOLS_YAML)
    spec = ColdStartSpec(task="color_tool", demonstrations=COUNT, seed=3)
    summary = record_and_export(tiny_model_dir, tmp_path / "tools.yaml", spec, tmp_path)
    assert (summary["rows"], summary["records"], summary["skipped"], summary["bad_records"]) == (COUNT, COUNT, {}, [])

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    config = {"pad_mode": "no_padding", "max_length": 2048}
    dataset = MultiTurnSFTDataset(str(tmp_path / "sft" / "train.parquet"), processor.tokenizer, config, processor)
    custom = demonstrations(tiny_model_dir, tmp_path / "tools.yaml", WarmStartSpec("color_tool", COUNT, seed=3))
    newline = processor.tokenizer.encode("\n")[0]
    exported = sorted((dataset[row] for row in range(COUNT)), key=lambda item: item["input_ids"].tolist())
    for item, example in zip(exported, sorted(custom, key=lambda example: example["input_ids"].tolist()), strict=True):
        # verl's row is the loop's trajectory plus the newline after its last <|im_end|>, and trains each
        # assistant turn's <|im_end|>\n where the custom fit trains what the model generated
        assert item["input_ids"].tolist() == [*example["input_ids"].tolist(), newline]
        trained = item["input_ids"][item["loss_mask"].bool()]
        labels = example["labels"][example["labels"] != -100]
        assert processor.tokenizer.decode(trained) == processor.tokenizer.decode(labels).replace(
            "<|im_end|>", "<|im_end|>\n"
        )


def test_tasks_whose_fit_verl_cannot_express_are_refused():
    with pytest.raises(ConfigError, match=r"the SFT cold start fits \['color', 'color_tool'\]; 'zoom_color' needs"):
        ColdStartSpec(task="zoom_color")
