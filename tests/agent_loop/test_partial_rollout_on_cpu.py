"""Partial rollout with images, exactly: a multi-image mm_tool trajectory whose generations a weight sync aborts mid-
turn (in the first turn, after a tool image, twice; in the last turn), resumed by verl's own
``FullyAsyncLLMServerClient``, equals the same trajectory generated without interruption: tokens, masks, log-probs,
MoE routing, images (ids and pixels) and tool sessions; only the weight versions differ, and they are recorded per
turn, per trajectory and per step. With ``async_training.partial_rollout=false`` the aborted generation is not
resumed: the trajectory is masked and counted."""

from __future__ import annotations

import json
import re
from html import unescape

import numpy as np
import pytest
import torch

from verl_mm_tools.agent_loop.hook_config import FULLY_ASYNC_HOOK, FULLY_ASYNC_HOOK_KEY
from verl_mm_tools.compact_image import expanded_inputs
from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.runtime.batch import image_prompt, unpadded_row
from verl_mm_tools.runtime.config import CLASSIC_HOOK
from verl_mm_tools.runtime.scripted_client import SCRIPTED_WEIGHTS_STEP, tool_call_text
from verl_mm_tools.step_metrics import aggregate_metrics
from verl_mm_tools.testkit.resume import InterruptingServer, resuming_client, scripted_routing
from verl_mm_tools.testkit.rows import marked_image
from verl_mm_tools.testkit.scripted import scripted_turn_expectations
from verl_mm_tools.tools import RotateTool
from verl_mm_tools.viewer.site import build_site

TURNS = [tool_call_text("rotate", degrees=90), tool_call_text("rotate", degrees=90, image_id=1), "<answer>90</answer>"]
TURNS[-1] += "<|im_end|>"
# cumulative token counts at which each turn's generation is aborted (a weight sync follows each abort)
INTERRUPTS = {0: [3], 1: [2, 5], 2: [4]}
PROMPT = [image_prompt("How far is this image rotated?", [marked_image()])]
V = SCRIPTED_WEIGHTS_STEP


class CountingRotate(RotateTool):
    """The rotate tool, counting its sessions."""

    def __init__(self):
        super().__init__({"type": "native"})
        self.created: list[str] = []
        self.executed: list[str] = []

    async def create(self, instance_id=None, **kwargs):
        instance_id, response = await super().create(instance_id, **kwargs)
        self.created.append(instance_id)
        return instance_id, response

    async def execute(self, instance_id, parameters, **kwargs):
        self.executed.append(instance_id)
        return await super().execute(instance_id, parameters, **kwargs)


def run(rollout, tmp_path, name, interrupts, extra=()):
    tool = CountingRotate()
    dump_dir = tmp_path / name
    output, server, worker = rollout.run(
        TURNS,
        PROMPT,
        tools=[tool],
        server=lambda tokenizer: InterruptingServer(tokenizer, TURNS, interrupts, routing=True),
        client=resuming_client,
        loop_options={"dump_dir": str(dump_dir)},
        extra=[*CLASSIC_HOOK, *extra],  # the step hook a dump needs (any trainer's; the classic one in-process)
    )
    (record_file,) = (dump_dir / "_staging").glob("*/record.json")
    return output, server, worker, tool, json.loads(record_file.read_text())


@pytest.fixture
def uninterrupted(rollout, tmp_path):
    return run(rollout, tmp_path, "plain", {})


def test_a_resumed_trajectory_equals_the_uninterrupted_one_but_for_its_weight_versions(
    rollout, tmp_path, uninterrupted
):
    plain, plain_server, worker, plain_tool, plain_record = uninterrupted
    output, server, _, tool, record = run(rollout, tmp_path, "resumed", INTERRUPTS)
    assert (plain_server.aborts, plain_server.resumes) == (0, 0)
    assert (server.aborts, server.resumes) == (4, 4)
    assert len(server.requests) == len(plain_server.requests) + 4

    # tokens, masks and log-probs: exactly the uninterrupted trajectory's, which is what the script generated
    row, plain_row = unpadded_row(output), unpadded_row(plain)
    assert row == plain_row
    generated = [worker.tokenizer.encode(turn, add_special_tokens=False) for turn in TURNS]
    mask, logprobs = scripted_turn_expectations(row["response_ids"], generated)
    assert row["response_mask"] == mask
    assert row["logprobs"] == pytest.approx(logprobs, abs=1e-7)  # float32 in the batch
    assert sum(row["response_mask"]) == sum(map(len, generated))  # nothing that should train is masked
    # MoE routing concatenated across the interruptions as verl does: the whole sequence's, once
    routing = output.batch["routed_experts"][0] if "routed_experts" in output.batch.keys() else None
    assert routing is not None and torch.equal(routing, plain.batch["routed_experts"][0])
    length = len(row["prompt_ids"]) + len(row["response_ids"])
    unpadded = routing[output.batch["attention_mask"][0].bool()]
    assert torch.equal(unpadded.long(), torch.from_numpy(scripted_routing(length)).long())

    # images: the same three (ids 1-3), the same pixels, sent with every request of their turn, resumes included
    inputs = expanded_inputs(output.non_tensor_batch["multi_modal_inputs"][0])  # as the trainer's engine does
    plain_inputs = expanded_inputs(plain.non_tensor_batch["multi_modal_inputs"][0])
    grids = [[1, 4, 6], [1, 6, 4], [1, 6, 4]]
    assert inputs["image_grid_thw"].tolist() == plain_inputs["image_grid_thw"].tolist() == grids
    assert torch.equal(inputs["pixel_values"], plain_inputs["pixel_values"])
    by_turn = {}
    for request in server.requests:
        by_turn.setdefault(server.turn_of(request["prompt_ids"]), []).append(request)
    assert {turn: len(requests) for turn, requests in by_turn.items()} == {0: 2, 1: 3, 2: 2}
    for turn, plain_request in enumerate(plain_server.requests):
        for request in by_turn[turn]:
            assert [list(image.getdata()) for image in request["images"]] == [
                list(image.getdata()) for image in plain_request["images"]
            ]
            assert request["prompt_ids"][: len(plain_request["prompt_ids"])] == plain_request["prompt_ids"]
    assert [image["id"] for image in record["images"]] == [image["id"] for image in plain_record["images"]] == [1, 2, 3]
    assert [turn["images_added"] for turn in record["turns"]] == [[2], [3], []]

    # tool sessions: one create per trajectory, each call on it, however many resumes
    assert len(tool.created) == len(plain_tool.created) == 1
    assert tool.executed == [tool.created[0]] * 2

    # weight versions: per turn (dump), per trajectory (extra fields, verl's own min/max too) and per step
    assert [turn["weight_versions"] for turn in plain_record["turns"]] == [[V, V]] * 3
    assert [turn["weight_versions"] for turn in record["turns"]] == [[V, V + 1], [V + 1, V + 3], [V + 3, V + 4]]
    fields = output.non_tensor_batch
    assert fields["mm_tool/weight_versions"][0] == [V, V + 4]
    assert (fields["min_global_steps"][0], fields["max_global_steps"][0]) == (V, V + 4)
    assert fields["mm_tool/resumed_generations"][0] == 3
    assert fields["mm_tool/masked"][0] == 0 and fields["mm_tool/stop_reason"][0] == "answered"
    metrics = aggregate_metrics(SampleFields.every_row(fields))
    # what the resumes cost the engine: each resumed request's whole prompt prefilled again (the sync before it
    # emptied the prefix cache) and its images sent again; the later turns' first requests keep their cache hits
    resumed_requests = [request for requests in by_turn.values() for request in requests[1:]]
    prefilled = sum(len(request["prompt_ids"]) for request in resumed_requests)
    assert [len(request["images"]) for request in resumed_requests] == [1, 2, 2, 3]
    assert (fields["mm_tool/resumes"][0], fields["mm_tool/resume_prefill_tokens"][0]) == (4, prefilled)
    assert fields["mm_tool/resume_images"][0] == 8
    # (a block more than without resumes: a resumed request held the partial tokens the next turn's prompt starts with)
    later_cached = fields["mm_tool/later_cached_tokens"][0], plain.non_tensor_batch["mm_tool/later_cached_tokens"][0]
    assert later_cached == (800, 784)
    metrics = aggregate_metrics(SampleFields.every_row(fields))
    assert {key: metrics[key] for key in VERSION_METRICS} == {
        "mm_tool/resumed_generations/count": 3.0,
        "mm_tool/multi_version_trajectories/count": 1.0,
        "mm_tool/version_span/max": 4.0,
        "mm_tool/aborted_generations/count": 0.0,
        "mm_tool/resumes/count": 4.0,
        "mm_tool/resume_prefill_tokens/sum": float(prefilled),
        "mm_tool/resume_images/sum": 8.0,
    }
    plain_metrics = aggregate_metrics(SampleFields.every_row(plain.non_tensor_batch))
    assert [plain_metrics[key] for key in VERSION_METRICS] == [0.0] * len(VERSION_METRICS)

    # the viewer shows where each turn was resumed: a note on the turn's message, its weights in the turns table
    assert weights_column(tmp_path, "plain") == (["v7", "v7", "v7"], 0)
    assert weights_column(tmp_path, "resumed") == (
        ["v7 → v8, resumed", "v8 → v10, resumed", "v10 → v11, resumed"],
        3,
    )


def weights_column(tmp_path, name) -> tuple[list[str], int]:
    """The viewer's page of the one trajectory dumped under ``name``: its turns table's Weights column and how many
    messages carry a resumed note."""
    (page,) = build_site(tmp_path / name, tmp_path / f"site_{name}").pages.values()
    html = page.read_text()
    table = html[html.index('<table id="turns">') :]
    table = table[: table.index("</table>")]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table)[1:]]
    return [unescape(row[-1]) for row in rows], html.count('<div class="note resumed">')


# verl's fully async trainer's config as verl-mm-tools' entry point marks it (its step hook runs)
HOOKED = f"+async_training.{FULLY_ASYNC_HOOK_KEY}={FULLY_ASYNC_HOOK}"


def test_a_dump_under_verls_own_fully_async_entry_point_is_refused_naming_ours(rollout, tmp_path):
    with pytest.raises(Exception, match=r"run python -m verl_mm_tools\.step_hook\.fully_async \(same config"):
        run(rollout, tmp_path, "verl", {}, extra=["+async_training.partial_rollout=true"])


VERSION_METRICS = (
    "mm_tool/resumed_generations/count",
    "mm_tool/multi_version_trajectories/count",
    "mm_tool/version_span/max",
    "mm_tool/aborted_generations/count",
    "mm_tool/resumes/count",
    "mm_tool/resume_prefill_tokens/sum",
    "mm_tool/resume_images/sum",
)


def test_without_partial_rollout_an_aborted_generation_masks_its_trajectory_and_is_counted(rollout, tmp_path):
    output, server, _, tool, record = run(
        rollout, tmp_path, "off", {1: [2]}, extra=[HOOKED, "+async_training.partial_rollout=false"]
    )
    assert (server.aborts, server.resumes) == (1, 0)
    fields = output.non_tensor_batch
    assert fields["mm_tool/masked"][0] == 1
    assert fields["mm_tool/error"][0].startswith(
        "EngineAbortedError: the rollout engine aborted generation 2 of the trajectory after 2 tokens"
    )
    assert "partial_rollout" in fields["mm_tool/error"][0]
    assert fields["mm_tool/aborted_generations"][0] == 1
    assert unpadded_row(output)["response_mask"] == [0]
    assert len(tool.created) == 1  # released once, however it ended
    metrics = aggregate_metrics(SampleFields.every_row(fields))
    assert metrics["mm_tool/aborted_generations/count"] == 1.0
    assert metrics["mm_tool/resumed_generations/count"] == 0.0
    assert metrics["mm_tool/masked/count"] == 1.0
    # the versions seen before the abort are kept: turn 1 ran under V, the aborted turn 2 under V and nothing after
    assert fields["mm_tool/weight_versions"][0] == [V, V]
    assert record["turns"] == []  # a masked trajectory's output holds none of its turns
    assert np.asarray(fields["mm_tool/resumed_generations"]).tolist() == [0]
