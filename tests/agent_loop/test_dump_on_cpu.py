"""Trajectory dumps of real mm_tool trajectories (tiny VLM, rotate tool, verl's AgentLoopWorker and reward worker,
published by MMToolAgentLoopManager): exact record values, the per-step and disk caps, failure isolation."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from PIL import Image

from verl_mm_tools.agent_loop import dump
from verl_mm_tools.agent_loop.config import MMToolLoopConfig
from verl_mm_tools.agent_loop.dump import folder_bytes
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.record import FULL_MARKER, RECORD_FILE, STAGING_DIR, STEP_SUMMARY
from verl_mm_tools.rewards.turn_credit import turn_spans
from verl_mm_tools.runtime.batch import unpadded_row
from verl_mm_tools.runtime.rollout import LocalRollout, run_steps
from verl_mm_tools.step_hook import dump as finalisation
from verl_mm_tools.testkit.sample_dump import SAMPLE_SCRIPTS, sample_rows, scripted_by_word
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

WORDS = list(SAMPLE_SCRIPTS)  # rotated, guess, typo, broken: batch rows 0..3


def dump_steps(rollout, dump_dir, steps=(1,), words=WORDS, validate=False, **options):
    prompts, columns = sample_rows(words)
    return run_steps(
        rollout,
        scripted_by_word,
        prompts,
        columns,
        steps=steps,
        validate=validate,
        loop_options={"dump_dir": str(dump_dir), **options},
    )


def records(step_dir) -> list[dict]:
    found = [json.loads(path.read_text()) for path in step_dir.glob(f"*/{RECORD_FILE}")]
    return sorted(found, key=lambda record: record["sample"]["index"])


def summary(step_dir) -> dict:
    return json.loads((step_dir / STEP_SUMMARY).read_text())


@pytest.fixture(scope="module")
def one_step(tiny_model_dir, tmp_path_factory):
    """The four sample scripts dumped at step 7, and what produced them."""
    workdir = tmp_path_factory.mktemp("dump")
    (workdir / "tools.yaml").write_text(ROTATE_TOOLS_YAML)
    dump_dir = workdir / "dump"
    (output,), server = dump_steps(LocalRollout(tiny_model_dir, workdir / "tools.yaml", workdir), dump_dir, steps=(7,))
    return dump_dir, output, server


def test_the_rotate_trajectory_is_dumped_with_exact_messages_images_mask_and_rewards(one_step, tiny_tokenizer):
    dump_dir, output, server = one_step
    record = records(dump_dir / "step_000007")[0]
    assert record["id"] == output.non_tensor_batch["mm_tool/dump"][0]["id"]
    roles = [message["role"] for message in record["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [message["image_ids"] for message in record["messages"]] == [[1], [], [2], [], [3], []]
    assert [message["turn"] for message in record["messages"]] == [0, 1, 1, 2, 2, 3]
    assert record["messages"][-1]["text"] == "<answer>90</answer>"
    assert record["tool_calls"] == [
        {
            "turn": 1,
            "name": "rotate",
            "arguments": {"degrees": 90},
            "error": False,
            "image_ids": [2],
            "result": "Image 2: Image 1 rotated by 90 degrees counter-clockwise, 84x56 px.",
        },
        {
            "turn": 2,
            "name": "rotate",
            "arguments": {"degrees": 90, "image_id": 1},
            "error": False,
            "image_ids": [3],
            "result": "Image 3: Image 1 rotated by 90 degrees counter-clockwise, 84x56 px.",
        },
    ]
    assert record["tools_used"] == ["rotate"]

    # every image: exactly the pixels the model saw on its last turn, plus a thumbnail
    requests = [request for request in server.requests if "rotated:" in tiny_tokenizer.decode(request["prompt_ids"])]
    seen = requests[-1]["images"]
    folder = dump_dir / "step_000007" / record["id"]
    assert [(image["id"], image["source"], image["turn"]) for image in record["images"]] == [
        (1, "prompt", 0),
        (2, "tool", 1),
        (3, "tool", 2),
    ]
    for entry, expected in zip(record["images"], seen, strict=True):
        with Image.open(folder / entry["file"]) as png:
            assert png.size == expected.size
            assert list(png.convert("RGB").getdata()) == list(expected.convert("RGB").getdata())
        assert (entry["width"], entry["height"]) == expected.size
        with Image.open(folder / entry["thumb"]) as thumb:
            assert thumb.format == "JPEG" and max(thumb.size) <= 160

    # mask summary per turn = the runs of the response mask verl trains on; trained tokens = the scripted turns
    row = unpadded_row(output, 0)
    spans = turn_spans(__import__("torch").tensor(row["response_mask"]))
    scripted = [len(tiny_tokenizer.encode(text, add_special_tokens=False)) for text in SAMPLE_SCRIPTS["rotated"]]
    assert [turn["trained_tokens"] for turn in record["turns"]] == [end - start for start, end in spans] == scripted
    assert [turn["context_tokens_after"] for turn in record["turns"]] == [
        spans[1][0] - spans[0][1],
        spans[2][0] - spans[1][1],
        len(row["response_mask"]) - spans[2][1],
    ]
    # the turns as the loop recorded them: each one's prompt is everything before its generated tokens
    prompt = len(row["prompt_ids"])
    assert [turn["prompt_tokens"] for turn in record["turns"]] == [prompt + start for start, _ in spans]
    assert [turn["tool_calls"] for turn in record["turns"]] == [["rotate"], ["rotate"], []]
    assert [turn["images_added"] for turn in record["turns"]] == [[2], [3], []]
    assert output.non_tensor_batch["mm_tool/turn_spans"][0] == [list(span) for span in spans]
    assert record["mask"] == {
        "prompt_tokens": len(row["prompt_ids"]),
        "response_tokens": len(row["response_mask"]),
        "trained_tokens": sum(row["response_mask"]),
        "context_tokens": row["response_mask"].count(0),
    }

    assert (record["step"], record["validate"], record["rollout_n"]) == (7, False, 0)
    assert record["sample"] == {
        "index": 0,
        "uid": None,
        "data_source": "verl_mm_tools/rotation",
        "ground_truth": "90",
        "extra_info": {"index": 0},
    }
    assert record["reward"]["score"] == pytest.approx(output.batch["rm_scores"][0].sum().item()) == pytest.approx(1.0)
    assert record["reward"]["extra"]["turn_discount"] == 1.0 and record["reward"]["extra"]["predicted_angle"] == 90.0
    assert record["reward"]["turn_rewards"] == [0.0, 0.0, 0.0] == [turn["reward"] for turn in record["turns"]]
    assert (record["stats"]["tool_calls"], record["stats"]["images"], record["stats"]["image_tokens"]) == (2, 3, 18)
    assert (record["masked"], record["stop_reason"], record["error"]) == (False, "answered", "")


def test_tool_errors_and_masked_trajectories_are_dumped_with_their_reasons(one_step):
    dump_dir, output, _ = one_step
    _, guess, typo, broken = records(dump_dir / "step_000007")
    assert guess["reward"]["score"] == 0.0 and guess["tool_calls"] == [] and len(guess["turns"]) == 1
    assert typo["tool_calls"][0]["name"] == "rotat" and typo["tool_calls"][0]["error"] is True
    assert typo["tool_calls"][0]["result"].startswith("Error: unknown tool 'rotat'; available tools: ['rotate'].")
    assert typo["messages"][2]["error"] is True
    assert broken["masked"] is True and broken["stop_reason"] == "error"
    assert broken["error"] == output.non_tensor_batch["mm_tool/error"][3]
    assert broken["error"].startswith("TrajectoryValidationError: the model generated vision placeholder tokens")
    assert broken["mask"]["trained_tokens"] == 0 and broken["turns"] == []
    assert [image["id"] for image in broken["images"]] == [1]  # the prompt the masked output keeps
    assert summary(dump_dir / "step_000007") == {
        "step": 7,
        "validate": False,
        "written": 4,
        "per_step_cap": 0,
        "disk_cap": 0,
        "error": 0,
        "not_found": 0,
    }
    assert not any((dump_dir / STAGING_DIR).iterdir())
    assert output.meta_info["timing"]["mm_tool/dump/written"] == 4.0


def test_per_step_cap_keeps_the_first_trajectories_of_each_step_and_logs_once(rollout, tmp_path, caplog):
    dump_dir = tmp_path / "dump"
    with caplog.at_level(logging.WARNING, logger=dump.__name__):
        outputs, _ = dump_steps(rollout, dump_dir, steps=(1, 2), dump_max_per_step=2)
    for step in (1, 2):
        step_dir = dump_dir / f"step_{step:06d}"
        assert [record["sample"]["index"] for record in records(step_dir)] == [0, 1]
        assert summary(step_dir) == {
            "step": step,
            "validate": False,
            "written": 2,
            "per_step_cap": 2,
            "disk_cap": 0,
            "error": 0,
            "not_found": 0,
        }
        assert outputs[step - 1].meta_info["timing"]["mm_tool/dump/skipped"] == 2.0
    assert not any((dump_dir / STAGING_DIR).iterdir())  # the skipped ones' images are gone too
    warnings = [record.getMessage() for record in caplog.records if "skipped" in record.getMessage()]
    assert len(warnings) == 1 and "dump_max_per_step=2" in warnings[0]


def test_disk_cap_stops_dumping_for_good_and_the_dump_stays_under_it(rollout, tmp_path):
    probe_dir = tmp_path / "probe"
    dump_steps(rollout, probe_dir)
    sizes = [folder_bytes(probe_dir / "step_000001" / record["id"]) for record in records(probe_dir / "step_000001")]
    max_mb = (sizes[0] + min(sizes[1:]) / 2) / 2**20  # room for the first trajectory, not for a second

    dump_dir = tmp_path / "dump"
    outputs, _ = dump_steps(rollout, dump_dir, steps=(1, 2), dump_max_mb=max_mb)
    assert summary(dump_dir / "step_000001") == {
        "step": 1,
        "validate": False,
        "written": 1,
        "per_step_cap": 0,
        "disk_cap": 3,
        "error": 0,
        "not_found": 0,
    }
    assert [record["sample"]["index"] for record in records(dump_dir / "step_000001")] == [0]
    assert (dump_dir / FULL_MARKER).exists()
    # step 2: the loops see the marker and write nothing at all
    assert all(
        reference["skipped"] == "disk_cap" and "dir" not in reference
        for reference in outputs[1].non_tensor_batch["mm_tool/dump"]
    )
    assert summary(dump_dir / "step_000002")["disk_cap"] == 4 and records(dump_dir / "step_000002") == []
    assert not any((dump_dir / STAGING_DIR).iterdir())
    assert folder_bytes(dump_dir) <= max_mb * 2**20


def test_validation_batches_go_to_their_own_step_folder(rollout, tmp_path):
    dump_steps(rollout, tmp_path / "dump", steps=(5,), words=["guess"], validate=True)
    (record,) = records(tmp_path / "dump" / "val_step_000005")
    assert (record["step"], record["validate"]) == (5, True)


def test_a_failing_dump_never_costs_the_trajectory(rollout, tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dump, "write_staged", full_disk)
    (output,), _ = dump_steps(rollout, tmp_path / "dump", words=["rotated"])
    assert output.non_tensor_batch["mm_tool/masked"][0] == 0
    assert output.batch["response_mask"][0].sum() > 0
    assert output.non_tensor_batch["mm_tool/dump"][0]["error"] == "OSError: [Errno 28] No space left on device"
    assert summary(tmp_path / "dump" / "step_000001")["error"] == 1


@pytest.mark.parametrize(
    "trainer, what_to_set",
    [
        (
            [],
            "v1 \\(trainer.use_v1=true, verl's default\\) trainer does not have: set "
            "trainer.v1.sampler.custom_sampler.path=pkg://verl_mm_tools.step_hook.replay_buffer "
            "trainer.v1.sampler.custom_sampler.name=MMToolReplayBuffer",
        ),
        (
            ["trainer.use_v1=false"],
            "classic trainer does not have: set \\+actor_rollout_ref.rollout.agent."
            "agent_loop_manager_class=verl_mm_tools.step_hook.manager.MMToolAgentLoopManager",
        ),
    ],
)
def test_dump_dir_without_the_step_hook_is_refused_with_what_to_set(rollout, tmp_path, trainer, what_to_set):
    # hydra wraps the ConfigError raised by the loop's constructor; the message is ours
    with pytest.raises(
        Exception,
        match=r"ConfigError\(\"mm_tool dump_dir needs verl-mm-tools' step hook, which this "
        r"run's " + what_to_set,
    ):
        rollout.run(
            ["<answer>90</answer><|im_end|>"],
            sample_rows(["guess"])[0],
            loop_options={"dump_dir": str(tmp_path / "dump")},
            extra=trainer,
        )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"dump_max_per_step": 0}, "dump_max_per_step must be a positive integer, got 0"),
        ({"dump_max_per_step": 2.5}, "dump_max_per_step must be a positive integer, got 2.5"),
        ({"dump_max_mb": -1}, "dump_max_mb must be a positive number, got -1"),
        ({"dump_max_mb": float("nan")}, "dump_max_mb must be a positive number, got nan"),
        ({"dump_dir": " "}, "dump_dir must be a directory path or null, got ' '"),
        ({"dump_dri": "/tmp/x"}, "Did you mean 'dump_dir'?"),
    ],
)
def test_invalid_dump_options_are_refused(options, message):
    with pytest.raises(ConfigError, match=__import__("re").escape(message)):
        MMToolLoopConfig.from_options(options, limit_images=None)


def test_dump_options_default_to_off_with_documented_caps():
    config = MMToolLoopConfig.from_options({}, limit_images=None)
    assert (config.dump_dir, config.dump_max_per_step, config.dump_max_mb) == (None, 16, 512.0)
    for name in ("dump_dir", "dump_max_per_step", "dump_max_mb"):
        assert f"{name}:" in MMToolLoopConfig.__doc__


def test_dump_options_never_leak_into_later_rollouts_of_the_process(rollout, tmp_path):
    dump_steps(rollout, tmp_path / "dump", words=["guess"])
    output, _, _ = rollout.run(["<answer>90</answer><|im_end|>"], sample_rows(["guess"])[0])
    assert output.non_tensor_batch.get("mm_tool/dump", [None])[0] is None


def test_a_staged_folder_the_driver_cannot_see_is_counted_and_explained(rollout, tmp_path, monkeypatch, caplog):
    real_write_staged = dump.write_staged

    def staged_on_another_node(*args):
        written = real_write_staged(*args)
        shutil.rmtree(written["dir"])  # what the driver sees when dump_dir is not on a shared file system
        return written

    monkeypatch.setattr(dump, "write_staged", staged_on_another_node)
    with caplog.at_level(logging.WARNING, logger=dump.__name__):
        dump_steps(rollout, tmp_path / "dump", words=["guess"])
    assert summary(tmp_path / "dump" / "step_000001")["not_found"] == 1
    assert "must be on a file system that the rollout workers and the trainer's driver share" in caplog.text


def test_a_failing_publication_never_stops_the_step(rollout, tmp_path, monkeypatch):
    def read_only(*args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(finalisation, "_publish", read_only)  # the trainer side's phase
    (output,), _ = dump_steps(rollout, tmp_path / "dump", words=["guess"])
    assert output.meta_info["timing"]["mm_tool/dump/failed"] == 1.0
    assert output.batch["rm_scores"].shape[0] == 1
