"""export-sft: recorded mm_tool trajectories (tiny VLMs, verl's AgentLoopWorker and reward worker, scripted turns)
written as verl's multi-turn SFT parquet and read back by verl's own MultiTurnSFTDataset, which must rebuild
exactly the tokens the loop ran, trained on the assistant turns only."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoProcessor

from verl_mm_tools.cli import main
from verl_mm_tools.compact_image import expanded_inputs
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.record import RECORD_FILE, RECORD_VERSION
from verl_mm_tools.runtime.batch import unpadded_row
from verl_mm_tools.runtime.rollout import LocalRollout, run_steps
from verl_mm_tools.testkit.sample_dump import sample_rows, scripted_by_word, write_sample_dump
from verl_mm_tools.tiny import tiny_model_path
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML
from verl_mm_tools.trajectories.sft import TRAIN_FILE, SFTFilters, export_sft

pytestmark = pytest.mark.integration  # the tiny model

ROTATE_AND_ZOOM_YAML = (
    ROTATE_TOOLS_YAML + "  - class_name: verl_mm_tools.tools.ZoomInTool\n    config:\n      type: native\n"
)
ROWS = {0: "rotated", 1: "guess", 2: "typo"}  # sample index -> script (3, "broken", is masked)


def sft_dataset(parquet, model_dir):
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    processor = AutoProcessor.from_pretrained(model_dir)
    config = {"pad_mode": "no_padding", "max_length": 4096}
    return MultiTurnSFTDataset(str(parquet), processor.tokenizer, config, processor)


def sources(parquet) -> list[dict]:
    import pandas as pd

    return [json.loads(open(path).read()) for path in pd.read_parquet(parquet)["source"]]


def sft_expectation(loop_row: dict, tokenizer) -> tuple[list[int], list[int]]:
    """The loop's tokens as verl's SFT dataset must rebuild them: the conversation plus the newline the template
    writes after the last <|im_end|>; verl trains an assistant message's "<|im_end|>\\n" where the loop generated
    <|im_end|> and the newline was the next turn's context."""
    end, newline = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.encode("\n")[0]
    prompt, response = loop_row["prompt_ids"], loop_row["response_ids"]
    ids = [*prompt, *response, newline]
    mask = [0] * len(prompt) + list(loop_row["response_mask"]) + [0]
    for index in range(len(prompt) + 1, len(ids)):
        if ids[index] == newline and ids[index - 1] == end and mask[index - 1] == 1:
            mask[index] = 1
    return ids, mask


@pytest.fixture(scope="module")
def qwen25_dump(tiny_model_dir, tmp_path_factory):
    """The four sample scripts on the faithful tiny Qwen2.5-VL (tool block in the system prompt, results as
    <tool_response> user turns), dumped at step 1; the generated batch."""
    workdir = tmp_path_factory.mktemp("qwen25")
    (output,) = write_sample_dump(workdir / "dump", workdir, model_dir=tiny_model_dir, steps=(1,))
    return workdir / "dump", output


@pytest.fixture(scope="module")
def qwen3_dump(tmp_path_factory):
    """The same scripts on the tiny Qwen3-VL (its template renders the schemas) with rotate and zoom_in offered."""
    workdir = tmp_path_factory.mktemp("qwen3")
    (workdir / "tools.yaml").write_text(ROTATE_AND_ZOOM_YAML)
    model_dir = str(tiny_model_path(family="qwen3_vl"))
    prompts, columns = sample_rows(list(ROWS.values()))
    rollout = LocalRollout(model_dir, workdir / "tools.yaml", workdir)
    options = {"dump_dir": str(workdir / "dump")}
    (output,), _ = run_steps(rollout, scripted_by_word, prompts, columns, steps=(1,), loop_options=options)
    return workdir / "dump", output, model_dir


def assert_round_trip(dump_dir, output, model_dir, out):
    export_sft([dump_dir], out)
    dataset = sft_dataset(out / TRAIN_FILE, model_dir)
    records = [json.loads(open(path).read()) for path in _sources(out)]
    assert sorted(record["sample"]["index"] for record in records) == [0, 1, 2]
    for position, record in enumerate(records):
        item = dataset[position]
        ids, mask = sft_expectation(unpadded_row(output, record["sample"]["index"]), dataset.tokenizer)
        assert item["input_ids"].tolist() == ids
        assert item["loss_mask"].tolist() == mask
    return dataset, records


def _sources(out):
    import pandas as pd

    return list(pd.read_parquet(out / TRAIN_FILE)["source"])


def test_verls_sft_dataset_rebuilds_the_loops_tokens_and_trains_the_assistant_turns(
    qwen25_dump, tiny_model_dir, tmp_path
):
    dump_dir, output = qwen25_dump
    dataset, records = assert_round_trip(dump_dir, output, tiny_model_dir, tmp_path / "sft")
    rotated = next(position for position, record in enumerate(records) if record["sample"]["index"] == 0)
    item = dataset[rotated]
    trained = dataset.tokenizer.decode(item["input_ids"][item["loss_mask"].bool()])
    call = '<tool_call>\n{{"name": "rotate", "arguments": {{"degrees": 90{}}}}}\n</tool_call><|im_end|>\n'
    assert trained == call.format("") + call.format(', "image_id": 1') + "<answer>90</answer><|im_end|>\n"
    # the prompt image and the two rotated ones, at the sizes and pixels the model saw
    loop_inputs = expanded_inputs(output.non_tensor_batch["multi_modal_inputs"][0])  # as the trainer's engine does
    assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == loop_inputs["image_grid_thw"].tolist()
    assert torch.equal(item["multi_modal_inputs"]["pixel_values"], loop_inputs["pixel_values"])


def test_two_tools_with_different_parameters_round_trip_with_fix_9(qwen3_dump, tmp_path):
    """Parquet gives each tool the other's parameters as nulls; verl would render them (fix 9)."""
    dump_dir, output, model_dir = qwen3_dump
    dataset, _ = assert_round_trip(dump_dir, output, model_dir, tmp_path / "sft")
    schemas = dataset.tools[0]
    assert [schema["function"]["name"] for schema in schemas] == ["rotate", "zoom_in"]
    assert "x1" not in schemas[0]["function"]["parameters"]["properties"]
    assert "degrees" not in schemas[1]["function"]["parameters"]["properties"]


def test_per_turn_rows_end_at_each_assistant_turn(qwen25_dump, tiny_model_dir, tmp_path):
    dump_dir, output = qwen25_dump
    export_sft([dump_dir], tmp_path / "sft", SFTFilters(tools_used=("rotate",)), per_turn=True)
    dataset = sft_dataset(tmp_path / "sft" / TRAIN_FILE, tiny_model_dir)
    ids, mask = sft_expectation(unpadded_row(output, 0), dataset.tokenizer)
    end = dataset.tokenizer.convert_tokens_to_ids("<|im_end|>")
    trained_ends = [index + 2 for index, token in enumerate(ids) if token == end and mask[index]]
    assert len(dataset) == len(trained_ends) == 3
    for row, length in enumerate(trained_ends):
        assert dataset[row]["input_ids"].tolist() == ids[:length]
        assert dataset[row]["loss_mask"].tolist() == mask[:length]


def rewritten_copy(dump_dir, target, change):
    shutil.copytree(dump_dir, target)
    for path in sorted(target.rglob(RECORD_FILE)):
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))
    return target


def test_filters_count_what_they_leave_out(qwen25_dump, tmp_path):
    dump_dir, _ = qwen25_dump
    summary = export_sft([dump_dir], tmp_path / "a", SFTFilters(min_reward=1.0, stops=("answered",)))
    assert (summary["rows"], summary["records"]) == (2, 2)  # rotated and typo; guess scored 0
    assert summary["skipped"] == {"masked (the loop trained on nothing)": 1, "reward below 1.0": 1}
    summary = export_sft([dump_dir], tmp_path / "b", SFTFilters(tools_used=("rotate",)))
    assert summary["skipped"] == {"masked (the loop trained on nothing)": 1, "did not use ['rotate']": 2}
    with pytest.raises(
        ConfigError, match=r"^no SFT row to write from \[.*\]: (?=.*1 masked)(?=.*3 data source not in)"
    ):
        export_sft([dump_dir], tmp_path / "c", SFTFilters(data_sources=("other",)))


def test_best_of_keeps_each_prompts_best_sample(qwen25_dump, tmp_path):
    """Three samples of one prompt (eval --samples 3: one uid): the best, and the earliest of equals."""
    dump_dir, _ = qwen25_dump

    def one_prompt(record):
        record["rollout_n"] = record["sample"]["index"]
        record["sample"]["uid"] = "prompt-0"

    copy = rewritten_copy(dump_dir, tmp_path / "dump", one_prompt)
    summary = export_sft([copy], tmp_path / "sft", SFTFilters(best_of=True))
    assert summary["skipped"] == {"masked (the loop trained on nothing)": 1, "not its prompt's best": 2}
    assert [record["rollout_n"] for record in sources(tmp_path / "sft" / TRAIN_FILE)] == [0]  # 1.0, before typo's


def test_bad_records_are_listed_with_their_file_and_the_good_ones_exported(qwen25_dump, tmp_path):
    dump_dir, _ = qwen25_dump
    copy = rewritten_copy(dump_dir, tmp_path / "dump", lambda record: None)
    paths = {json.loads(path.read_text())["sample"]["index"]: path for path in copy.rglob(RECORD_FILE)}
    paths[0].write_text(paths[0].read_text()[:100])  # truncated
    record = json.loads(paths[1].read_text())
    paths[1].write_text(json.dumps({**record, "version": 99}))
    (paths[2].parent / "images" / "1.png").unlink()
    paths[3].write_text(json.dumps({**json.loads(paths[3].read_text()), "version": 3, "masked": False, "chat": None}))
    with pytest.raises(ConfigError) as refused:
        export_sft([copy], tmp_path / "none")
    assert all(str(path) in str(refused.value) for path in paths.values())
    rewritten_copy(dump_dir, copy / "good", lambda record: record.update(id=record["id"][::-1]))  # other ids
    summary = export_sft([copy], tmp_path / "sft")
    reasons = {bad["path"]: bad["reason"] for bad in summary["bad_records"]}
    assert summary["rows"] == 3
    assert reasons[str(paths[0])].startswith(f"{paths[0]}: not a readable JSON record")
    assert reasons[str(paths[1])] == (
        f"{paths[1]}: record version 99; this verl-mm-tools reads versions 1 to {RECORD_VERSION}: upgrade "
        "verl-mm-tools to read newer records"
    )
    assert reasons[str(paths[2])] == f"{paths[2]}: image 1's file {paths[2].parent / 'images' / '1.png'} is missing"
    assert reasons[str(paths[3])].startswith(f"{paths[3]}: record version 3 has no rendered conversation")


def test_the_command_line_writes_the_parquet_and_says_how_to_train(qwen25_dump, tmp_path, capsys):
    dump_dir, _ = qwen25_dump
    assert main(["export-sft", str(dump_dir), "--out", str(tmp_path), "--min-reward", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"wrote 2 rows from 2 trajectories to {tmp_path / TRAIN_FILE} (seen: 4 train, 0 val; exported: the train split)"
    )
    assert lines[1].startswith("skipped: 1 masked (the loop trained on nothing), 1 reward below 1.0; unreadable: 0")
    assert lines[2] == (  # complete: absolute paths, the model that generated the trajectories, no "..."
        "train: torchrun --standalone --nproc_per_node=1 -m verl.trainer.sft_trainer "
        f"data.train_files={tmp_path / TRAIN_FILE} data.messages_key=messages data.image_key=images "
        f"model.path={tiny_model_path()} trainer.default_local_dir={tmp_path / 'checkpoints'}"
    )
    assert main(["export-sft", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
