"""verl's own multi-turn SFT trainer (``verl.trainer.sft_trainer`` under torchrun) on CPU, through
``verl_mm_tools.cpu.sft``: trained on trajectories the mm_tool loop recorded and ``export-sft`` wrote, the tiny
tool-aware Qwen2.5-VL writes the tool call it was shown, token for token; its first step's loss is the Hugging Face
model's on the same images; its overrides and errors."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from PIL import Image

from verl_mm_tools.cpu import sft
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.tiny import tiny_model_path

ROTATE = {
    "type": "function",
    "function": {
        "name": "rotate",
        "description": "Rotate the image.",
        "parameters": {
            "type": "object",
            "properties": {"angle": {"type": "integer", "description": "degrees, counter-clockwise"}},
            "required": ["angle"],
        },
    },
}
SYSTEM = "You are a helpful assistant."
QUESTION = "What colour is the picture?"
TOOL_CALL = '<tool_call>\n{"name": "rotate", "arguments": {"angle": 90}}\n</tool_call>'
ANSWER = "<answer>red</answer>"
ROWS = 16
STEPS = 60


def png(color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (56, 56), color).save(buffer, format="PNG")
    return buffer.getvalue()


PICTURE, ROTATED = png((200, 30, 0)), png((0, 30, 200))


def conversation_row() -> dict:
    """One row in MultiTurnSFTDataset's layout, as export-sft writes it (tools as JSON text): the system prompt
    renders the hermes tool block, the tool's image comes back in a user turn."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"<image>{QUESTION}"},
        {"role": "assistant", "content": TOOL_CALL},
        {"role": "user", "content": "<tool_response>\n<image>\n</tool_response>"},
        {"role": "assistant", "content": ANSWER},
    ]
    return {"messages": messages, "images": [{"bytes": PICTURE}, {"bytes": ROTATED}], "tools": json.dumps([ROTATE])}


def write_parquet(path, rows: int = ROWS):
    # identical rows: any batch's mean loss is one row's, which the loss test computes with the HF model
    pd.DataFrame([conversation_row()] * rows).to_parquet(path)
    return path


@pytest.fixture(scope="module")
def tool_aware_dir():
    return tiny_model_path(template="tool_aware")


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    return write_parquet(tmp_path_factory.mktemp("sft_data") / "train.parquet")


@pytest.fixture(scope="module")
def exported_file(tool_aware_dir, tmp_path_factory):
    """ROWS trajectories of the mm_tool loop (verl's AgentLoopWorker, the rotate tool, a scripted model that
    rotates and answers), dumped and written by export-sft: identical rows, so any batch's mean loss is one row's."""
    from verl_mm_tools.runtime.batch import image_prompt
    from verl_mm_tools.runtime.rollout import LocalRollout, run_steps
    from verl_mm_tools.runtime.scripted_client import tool_call_text
    from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML
    from verl_mm_tools.trajectories.sft import TRAIN_FILE, export_sft

    work = tmp_path_factory.mktemp("recorded")
    (work / "tools.yaml").write_text(ROTATE_TOOLS_YAML)
    prompts = [image_prompt(QUESTION, [Image.open(io.BytesIO(PICTURE))])] * ROWS
    columns = {"data_source": ["colour"] * ROWS, "reward_model": [{"ground_truth": "red"}] * ROWS}
    turns = [tool_call_text("rotate", degrees=90), ANSWER + "<|im_end|>"]
    options = {"dump_dir": str(work / "dump"), "dump_max_per_step": ROWS}
    reward = ["reward.reward_kwargs.reward_fn=exact_answer_reward"]
    rollout = LocalRollout(tool_aware_dir, work / "tools.yaml", work)
    run_steps(rollout, lambda tokenizer: turns, prompts, columns, steps=(1,), loop_options=options, extra=reward)
    assert export_sft([work / "dump"], work / "sft")["rows"] == ROWS
    return work / "sft" / TRAIN_FILE


@pytest.fixture(scope="module")
def trained(tool_aware_dir, exported_file, tmp_path_factory):
    """``verl-mm-tools sft`` (run_verl_sft) on the exported rows. lr 3e-3 (the command's default): at 1e-2
    (constant or cosine over 60 steps) verl's run (AdamW, gradients clipped at 1) fitted these rows like a bigram
    model (loss ~0.37 per token) and wrote a wrong token at the call's third."""
    from verl_mm_tools.cli import main

    out = tmp_path_factory.mktemp("verl_sft")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert (
            main(
                [
                    "sft",
                    "--model",
                    str(tool_aware_dir),
                    "--data",
                    str(exported_file),
                    "--out",
                    str(out),
                    "--steps",
                    str(STEPS),
                ]
            )
            == 0
        )
    return Path(printed.getvalue().strip()), out


def prompt_inputs(processor, exported_file):
    """The chat template's render of the exported conversation up to its first user turn (with the picture), with
    the generation prompt: what the loop rendered before the model's first turn."""
    row = pd.read_parquet(exported_file).iloc[0]
    first_turn = list(row["messages"])[: [message["role"] for message in row["messages"]].index("assistant")]
    assert [message["content"] for message in first_turn] == [f"<image>{QUESTION}"]
    picture = Image.open(io.BytesIO(row["images"][0]["bytes"]))
    messages = [{"role": "user", "content": [{"type": "image", "image": picture}, {"type": "text", "text": QUESTION}]}]
    tools = json.loads(row["tools"]) if "tools" in row and row["tools"] else None
    return processor.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )


def shown_reply_ids(processor) -> list[int]:
    """The assistant turn verl trained (its generation prompt excluded): the call, then <|im_end|>."""
    from verl_mm_tools.runtime.scripted_client import tool_call_text

    return processor.tokenizer.encode(tool_call_text("rotate", degrees=90))


def greedy_reply(model_dir, exported_file) -> tuple[list[int], list[int]]:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    inputs = prompt_inputs(processor, exported_file)
    target = shown_reply_ids(processor)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=len(target) + 4, do_sample=False)
    return output[0, inputs["input_ids"].shape[1] :].tolist(), target


@pytest.mark.slow
def test_the_saved_model_writes_the_tool_call_it_was_shown_and_the_untrained_one_does_not(
    trained, tool_aware_dir, exported_file
):
    model_dir, out = trained
    assert model_dir == out / "checkpoints" / f"global_step_{STEPS}" / "huggingface"
    assert [step["step"] for step in sft.trainer_steps(out / sft.LOG_FILE)] == list(range(1, STEPS + 1))
    reply, target = greedy_reply(model_dir, exported_file)
    assert reply == target
    untrained_reply, _ = greedy_reply(tool_aware_dir, exported_file)
    assert untrained_reply != target


@pytest.mark.slow
def test_the_saved_model_says_the_dtype_its_weights_have(trained):
    """verl writes "bfloat16" into the config of the float32 weights it saves (cpu_patches 6 corrects it)."""
    from transformers import AutoModelForImageTextToText

    model_dir, _ = trained
    config = json.loads((model_dir / "config.json").read_text())
    dtypes = [config["dtype"], config["text_config"]["dtype"], config["vision_config"]["dtype"]]
    assert dtypes == ["float32", "float32", "float32"]
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}


def hf_loss_of_one_row(model_dir, train_file) -> float:
    """The mean negative log-likelihood of the row's assistant tokens (verl's own mask) under the Hugging Face
    model, with its images and mm_token_type_ids (without it transformers skips Qwen-VL's M-RoPE)."""
    from transformers import AutoModelForImageTextToText
    from verl.utils import hf_processor, hf_tokenizer
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    processor, tokenizer = hf_processor(str(model_dir)), hf_tokenizer(str(model_dir))
    config = {"pad_mode": "no_padding", "max_length": 1024}
    row = MultiTurnSFTDataset(str(train_file), tokenizer, config, processor)[0]
    ids = row["input_ids"][None]
    images = row["multi_modal_inputs"]
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            mm_token_type_ids=(ids == processor.image_token_id).long(),
            pixel_values=images["pixel_values"],
            image_grid_thw=images["image_grid_thw"],
        ).logits[0]
    log_probs = torch.log_softmax(logits, dim=-1)[:-1].gather(-1, ids[0, 1:, None])[:, 0]
    trained = row["loss_mask"][1:].bool()
    assert int(trained.sum()) == 30  # both assistant turns and their <|im_end|>\n, not the generation prompts
    return float(-log_probs[trained].mean())


@pytest.mark.slow
def test_verls_first_step_loss_is_the_hf_models_loss_with_the_images(trained, tool_aware_dir, exported_file):
    """The images, the 3-D position ids and the loss mask went through verl's FSDP engine on CPU as the model
    expects them: the loss verl logged before its first update is the untrained model's own."""
    _, out = trained
    first = sft.trainer_steps(out / sft.LOG_FILE)[0]
    assert first["train/loss"] == pytest.approx(hf_loss_of_one_row(tool_aware_dir, exported_file), rel=1e-6, abs=0)


@pytest.mark.slow
def test_a_failing_trainer_is_reported_with_the_end_of_its_log(train_file, tmp_path):
    with pytest.raises(sft.VerlSFTError, match="exited with status 1") as raised:
        sft.run_verl_sft(tmp_path / "no_model", train_file, tmp_path / "out", steps=1, timeout_s=300)
    message = str(raised.value)
    assert f"full log: {tmp_path / 'out' / sft.LOG_FILE}" in message
    assert str(tmp_path / "no_model") in message.split("its end:")[1]  # verl's own error names the path
    assert "ChildFailedError" not in message  # torchrun's report, which names no cause, is left out


# ----- the overrides (fast) ----------------------------------------------------------------------------------------


def test_the_overrides_are_the_cpu_ones_then_the_run_s(tool_aware_dir, train_file, tmp_path):
    overrides = sft.sft_overrides(tool_aware_dir, train_file, tmp_path, steps=10, batch_size=3, lr=0.5, seed=7)
    cpu = [override for override, _ in sft.CPU_SFT_OVERRIDES]
    assert overrides[: len(cpu)] == cpu
    assert overrides[len(cpu) :] == [
        f"model.path='{tool_aware_dir}'",
        f"data.train_files=['{train_file}']",
        "data.train_batch_size=3",
        "data.micro_batch_size_per_gpu=3",
        "data.max_token_len_per_gpu=8192",
        "data.max_length=1024",
        "optim.lr=0.5",
        "engine.seed=7",
        "trainer.seed=7",
        "trainer.total_training_steps=10",
        "trainer.total_epochs=2",  # 16 rows // 3 = 5 steps an epoch
        "checkpoint.save_contents=[hf_model]",
        f"trainer.default_local_dir='{tmp_path / 'checkpoints'}'",
    ]


def test_the_overrides_compose_with_verls_sft_config(tool_aware_dir, train_file, tmp_path):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose("sft_trainer_engine", overrides=sft.sft_overrides(tool_aware_dir, train_file, tmp_path))
    assert config.engine.strategy == "fsdp2"
    assert config.model.override_config.attn_implementation == "sdpa"
    assert config.model.use_remove_padding is False
    assert config.data.enable_thinking_default is None
    assert list(config.data.train_files) == [str(train_file)]
    assert list(config.trainer.logger) == ["console"]
    assert list(config.checkpoint.save_contents) == ["hf_model"]
    assert config.trainer.total_epochs == 10  # 40 steps, 4 a epoch


def test_paths_are_taken_literally_by_hydra(tmp_path):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    path = tmp_path / "it's a [weird], path=x"
    parsed = OverridesParser.create().parse_override(f"model.path={sft.hydra_string(path)}")
    assert parsed.value() == str(path)


def test_an_unknown_knob_is_refused_with_the_closest_one(tool_aware_dir, train_file, tmp_path):
    with pytest.raises(ConfigError, match=r"unknown knob 'step'.*Did you mean 'steps'\?"):
        sft.sft_overrides(tool_aware_dir, train_file, tmp_path, step=3)


def test_fewer_rows_than_a_batch_are_refused(tool_aware_dir, tmp_path):
    small = write_parquet(tmp_path / "small.parquet", rows=3)
    with pytest.raises(ConfigError, match="hold 3 rows, fewer than one batch of 4"):
        sft.sft_overrides(tool_aware_dir, small, tmp_path)


def test_a_run_without_the_hf_model_is_refused(tool_aware_dir, train_file, tmp_path):
    with pytest.raises(ConfigError, match="lacks 'hf_model'"):
        sft.sft_overrides(tool_aware_dir, train_file, tmp_path, save_contents=("model",))


def test_checkpoints_of_an_earlier_run_are_refused(tool_aware_dir, train_file, tmp_path):
    (tmp_path / sft.CHECKPOINTS_DIR / "global_step_3").mkdir(parents=True)
    with pytest.raises(ConfigError, match="holds checkpoints of an earlier run"):
        sft.run_verl_sft(tool_aware_dir, train_file, tmp_path)


def test_the_error_tail_stops_before_torchruns_report(tmp_path):
    log = tmp_path / "log"
    log.write_text(
        "line 1\nValueError: the cause\n\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"
        "E1128 16:48:35.807000 21110 torch/distributed/elastic/multiprocessing/api.py:986] failed (exitcode: 1)\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    )
    assert sft.trainer_error_tail(log) == ["line 1", "ValueError: the cause", ""]


def test_console_metrics_are_read_after_tqdm_fragments(tmp_path):
    log = tmp_path / "log"
    log.write_text(
        "step:1 - train/loss:6.5 - train/lr:0.01\n"
        "\rEpoch 1/4:  25%|##    | 1/4 [00:00<00:01,  2.23it/s]step:2 - train/loss:6.25 - note:text\n"
    )
    assert sft.trainer_steps(log) == [
        {"step": 1, "train/loss": 6.5, "train/lr": 0.01},
        {"step": 2, "train/loss": 6.25, "note": "text"},
    ]
