"""mm_tool behaviour through verl's real AgentLoopWorker: tool sessions, image budget, failure isolation, malformed
calls, timeouts, configuration errors, truncation (verl #4050) and step metrics."""

from __future__ import annotations

import asyncio

import pytest
import torch
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from verl_mm_tools.agent_loop.validation import placeholder_runs, trajectory_problems
from verl_mm_tools.cpu.hf_engine import HFVisionLM
from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.runtime.batch import image_prompt, unpadded_row
from verl_mm_tools.runtime.scripted_client import tool_call_text
from verl_mm_tools.step_metrics import aggregate_metrics
from verl_mm_tools.testkit.rows import marked_image
from verl_mm_tools.tokens import processor_image_tokens

ANSWER = "<answer>90</answer><|im_end|>"
ROTATE = tool_call_text("rotate", degrees=90)
ROTATE_FIRST = tool_call_text("rotate", degrees=90, image_id=1)


class SessionProbe(BaseTool):
    """Records its lifecycle. ``x == 13`` raises, ``x == 7`` sleeps for a second, ``x == 11`` answers text that is
    not valid (a lone surrogate, NUL, an escape)."""

    def __init__(self):
        schema = {
            "type": "function",
            "function": {
                "name": "probe",
                "description": "Probe.",
                "parameters": {
                    "type": "object",
                    "properties": {"x": {"type": "integer", "description": "Input."}},
                    "required": ["x"],
                },
            },
        }
        self.config, self.tool_schema, self.name = {}, OpenAIFunctionToolSchema.model_validate(schema), "probe"
        self.created, self.executed, self.released = [], [], []

    async def create(self, instance_id=None, **kwargs):
        instance_id = f"probe-{len(self.created)}"
        self.created.append((instance_id, kwargs.get("create_kwargs")))
        return instance_id, ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        self.executed.append(instance_id)
        if parameters["x"] == 13:
            raise RuntimeError("boom")
        if parameters["x"] == 7:
            await asyncio.sleep(1.0)
        if parameters["x"] == 11:
            return ToolResponse(text="bad \ud800 \x00 \x1b[0m end"), 0.5, {}
        return ToolResponse(text=f"probe says {parameters['x']}"), 0.5, {}

    async def release(self, instance_id, **kwargs):
        self.released.append(instance_id)


def probe_call(x: int) -> str:
    return tool_call_text("probe", x=x)


PROMPT = [image_prompt("How far is this image rotated?", [marked_image()])]


def field(output, key, index=0):
    return output.non_tensor_batch[key][index]


def tool_texts(server, tokenizer) -> str:
    """The text of the last request the server received."""
    return tokenizer.decode(server.requests[-1]["prompt_ids"])


# ----- sessions ---------------------------------------------------------------------------------------------------


def test_session_is_created_once_reused_and_released_once_on_success(rollout):
    probe = SessionProbe()
    columns = {"tools_kwargs": [{"probe": {"create_kwargs": {"seed": 3}}}]}
    output, _, _ = rollout.run([probe_call(1), probe_call(2), ANSWER], PROMPT, tools=[probe], columns=columns)
    assert probe.created == [("probe-0", {"seed": 3})]
    assert probe.executed == ["probe-0", "probe-0"]
    assert probe.released == ["probe-0"]
    assert field(output, "mm_tool/stop_reason") == "answered"
    assert field(output, "tool_rewards") == [0.5, 0.5]
    assert field(output, "mm_tool/per_tool")["probe"]["calls"] == 2


@pytest.mark.parametrize(
    ("turns", "config", "stop_reason"),
    [
        ([probe_call(13)], {}, "error"),
        ([probe_call(1), probe_call(2), probe_call(3), ANSWER], {"max_turns": 2}, "turn_limit"),
        ([probe_call(1), "x" * 40 + "<|im_end|>"], {"response_length": 48}, "length_limit"),
    ],
    ids=["tool-raises", "turn-limit", "length-limit"],
)
def test_session_is_released_exactly_once_however_the_trajectory_ends(rollout, turns, config, stop_reason):
    probe = SessionProbe()
    output, _, _ = rollout.run(turns, PROMPT, tools=[probe], **config)
    assert field(output, "mm_tool/stop_reason") == stop_reason
    assert len(probe.created) == 1
    assert probe.released == [probe.created[0][0]]


def test_a_tools_text_that_is_not_valid_reaches_the_model_as_valid_text(rollout):
    """A lone surrogate made the tokenizer raise (the trajectory masked); control characters are replaced too."""
    output, server, worker = rollout.run([probe_call(11), ANSWER], PROMPT, tools=[SessionProbe()])
    assert field(output, "mm_tool/stop_reason") == "answered"
    answer = tool_texts(server, worker.tokenizer).rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
    assert answer == "bad \ufffd \ufffd \ufffd[0m end"


# ----- image budget ------------------------------------------------------------------------------------------------


def test_max_images_refuses_the_extra_image_with_a_text_response(rollout):
    output, server, worker = rollout.run([ROTATE, ROTATE, ANSWER], PROMPT, loop_options={"max_images": 2})
    assert output.non_tensor_batch["multi_modal_inputs"][0]["image_grid_thw"].tolist() == [[1, 4, 6], [1, 6, 4]]
    assert field(output, "mm_tool/images") == 2
    assert field(output, "mm_tool/budget_refusals") == 1
    last_response = tool_texts(server, worker.tokenizer).rsplit("<tool_response>", 1)[1]
    assert "Note: the image budget is exhausted (at most 2 images per conversation)" in last_response
    assert "<|image_pad|>" not in last_response and "Image 3" not in last_response


@pytest.mark.parametrize(
    ("over_budget", "grids", "runs", "note"),
    [
        ("downscale", [[1, 4, 6], [1, 6, 4], [1, 4, 2]], [6, 6, 2], "the image was downscaled to 28x56 px"),
        (
            "refuse",
            [[1, 4, 6], [1, 6, 4]],
            [6, 6],
            "the image token budget is exhausted (4 image tokens left, the image needs 6)",
        ),
    ],
)
def test_max_image_tokens_downscales_or_refuses(rollout, over_budget, grids, runs, note):
    options = {"max_image_tokens": 16, "over_budget": over_budget}
    output, server, worker = rollout.run([ROTATE, ROTATE_FIRST, ANSWER], PROMPT, loop_options=options)
    row = unpadded_row(output)
    assert output.non_tensor_batch["multi_modal_inputs"][0]["image_grid_thw"].tolist() == grids
    image_pad = worker.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert placeholder_runs(row["prompt_ids"] + row["response_ids"], image_pad) == runs
    assert note in tool_texts(server, worker.tokenizer)
    assert field(output, "mm_tool/image_tokens") == sum(runs)


def test_over_budget_stop_ends_the_trajectory_without_the_refused_turn(rollout):
    options = {"max_image_tokens": 16, "over_budget": "stop"}
    output, server, _ = rollout.run([ROTATE, ROTATE_FIRST, ANSWER], PROMPT, loop_options=options)
    assert field(output, "mm_tool/stop_reason") == "budget"
    assert len(server.requests) == 2
    assert output.non_tensor_batch["multi_modal_inputs"][0]["image_grid_thw"].tolist() == [[1, 4, 6], [1, 6, 4]]
    assert unpadded_row(output)["response_mask"][-1] == 1  # ends with the model's own (refused) call


# ----- configuration -------------------------------------------------------------------------------------------


def test_budget_larger_than_the_servers_image_limit_is_refused_at_start(rollout):
    # hydra wraps the ConfigError raised by the loop's constructor; the message is ours
    with pytest.raises(
        Exception, match=r"ConfigError.*max_images=20 exceeds actor_rollout_ref.rollout.limit_images=8.*max_images <= 8"
    ):
        rollout.run(
            [ANSWER], PROMPT, loop_options={"max_images": 20}, extra=["+actor_rollout_ref.rollout.limit_images=8"]
        )


def test_max_images_defaults_to_the_servers_limit(rollout):
    output, _, _ = rollout.run([ROTATE, ROTATE, ANSWER], PROMPT, extra=["+actor_rollout_ref.rollout.limit_images=2"])
    assert field(output, "mm_tool/images") == 2
    assert field(output, "mm_tool/budget_refusals") == 1


def test_unknown_option_is_refused_with_a_suggestion(rollout):
    with pytest.raises(Exception, match=r"ConfigError.*unknown mm_tool option 'max_image'.*Did you mean 'max_images'"):
        rollout.run([ANSWER], PROMPT, loop_options={"max_image": 3})


# ----- model mistakes are answered, not fatal ------------------------------------------------------------------


def test_malformed_and_unknown_calls_get_model_readable_errors(rollout):
    turns = ["<tool_call>\n{not json}\n</tool_call><|im_end|>", tool_call_text("zoom", factor=2), ANSWER]
    output, server, worker = rollout.run(turns, PROMPT)
    text = tool_texts(server, worker.tokenizer)
    assert "Error: a tool call could not be parsed" in text
    assert "Error: unknown tool 'zoom'; available tools: ['rotate']." in text
    assert field(output, "mm_tool/invalid_actions") == 2
    assert field(output, "mm_tool/stop_reason") == "answered"
    assert field(output, "mm_tool/masked") == 0


def test_a_hanging_tool_is_cancelled_and_the_model_told(rollout):
    probe = SessionProbe()
    output, server, worker = rollout.run(
        [probe_call(7), ANSWER], PROMPT, tools=[probe], loop_options={"tool_timeout_s": 0.2}
    )
    assert "Error: tool 'probe' took longer than 0.2 s and was cancelled" in tool_texts(server, worker.tokenizer)
    assert field(output, "mm_tool/tool_errors") == 1
    assert field(output, "mm_tool/masked") == 0
    assert probe.released == ["probe-0"]


# ----- failure isolation -------------------------------------------------------------------------------------------


def test_failing_trajectories_are_masked_and_the_batch_completes(rollout):
    """One good trajectory, one whose tool raises, one whose model samples <|image_pad|>, in one verl batch."""

    def script(turn, prompt_ids, images):
        question = server_tokenizer.decode(prompt_ids)
        if turn > 0:
            return ANSWER
        if "crash" in question:
            return probe_call(13)
        if "degenerate" in question:
            return "<|image_pad|><|im_end|>"
        return probe_call(1)

    probe = SessionProbe()
    prompts = [
        image_prompt(f"{word}: how far is this rotated?", [marked_image()]) for word in ("fine", "crash", "degenerate")
    ]
    worker_config = rollout.config()
    from verl_mm_tools.runtime.batch import make_batch
    from verl_mm_tools.runtime.workers import generate, make_worker
    from verl_mm_tools.testkit.scripted import ScriptedServer

    worker = make_worker(worker_config, None)
    worker.tools = [probe]
    server_tokenizer = worker.tokenizer
    worker.llm_client = ScriptedServer(worker.tokenizer, script)
    output = generate(worker, make_batch(prompts))

    assert list(output.non_tensor_batch["mm_tool/masked"]) == [0, 1, 1]
    assert output.non_tensor_batch["mm_tool/error"][1] == "ToolCrashError: tool 'probe' raised RuntimeError: boom"
    image_pad = worker.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert output.non_tensor_batch["mm_tool/error"][2] == (
        f"TrajectoryValidationError: the model generated vision placeholder tokens [{image_pad}]"
    )
    assert output.batch["response_mask"][0].sum() > 0
    assert output.batch["response_mask"][1:].sum() == 0
    # masked samples keep their prompt and its image, so the batch's multimodal inputs stay aligned
    assert [inputs["image_grid_thw"].tolist() for inputs in output.non_tensor_batch["multi_modal_inputs"]] == [
        [[1, 4, 6]]
    ] * 3
    assert sorted(instance for instance, _ in probe.created) == sorted(probe.released) == ["probe-0", "probe-1"]

    metrics = aggregate_metrics(SampleFields.every_row(output.non_tensor_batch))
    assert metrics["mm_tool/masked/count"] == 2.0
    assert metrics["mm_tool/stop/error"] == pytest.approx(2 / 3)
    assert metrics["mm_tool/stop/answered"] == pytest.approx(1 / 3)
    assert metrics["mm_tool/tool/probe/calls_per_trajectory"] == pytest.approx(2 / 3)
    assert metrics["mm_tool/tool/probe/error_rate"] == 0.5
    # two of the three trajectories called a tool (one call each; the crashed one is masked but counted)
    assert metrics["mm_tool/tool_call_rate"] == metrics["mm_tool/tool/probe/call_rate"] == pytest.approx(2 / 3)


def test_a_prompt_over_the_image_budget_is_masked_with_a_text_stand_in(rollout):
    prompt = [image_prompt("two images", [marked_image(), marked_image()])]
    output, server, _ = rollout.run([ANSWER], prompt, loop_options={"max_images": 1})
    assert field(output, "mm_tool/masked") == 1
    assert field(output, "mm_tool/error").startswith(
        "ImageBudgetError: the prompt holds 2 images, more than max_images=1"
    )
    assert server.requests == []
    assert "image_grid_thw" not in output.non_tensor_batch["multi_modal_inputs"][0]


# ----- truncation: the failure class behind verl issue #4050 --------------------------------------------------------


def test_a_cut_through_a_tool_image_breaks_the_forward_and_mm_tool_never_emits_one(rollout):
    model = HFVisionLM(rollout.model_dir)
    turns = [ROTATE, ROTATE_FIRST, ANSWER]
    full, _, worker = rollout.run(turns, PROMPT)
    row = unpadded_row(full)
    image_pad = worker.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    second_tool_image_end = max(i for i, token in enumerate(row["response_ids"]) if token == image_pad) + 1

    # What a loop that cuts at the length limit produces: the last image's placeholders half gone, its features not.
    cut = row["response_ids"][: second_tool_image_end - 3]
    images = [marked_image(), marked_image().rotate(90, expand=True), marked_image().rotate(90, expand=True)]
    tokens = [processor_image_tokens(worker.processor, image) for image in images]
    problems = trajectory_problems(
        prompt_ids=row["prompt_ids"],
        response_ids=cut,
        response_mask=[0] * len(cut),
        response_logprobs=None,
        image_tokens=tokens,
        image_token_id=image_pad,
        forbidden_generated=frozenset(),
    )
    assert problems == ["image placeholder runs [6, 6, 3] do not match the processor's tokens per image [6, 6, 6]"]
    with pytest.raises(ValueError, match="Image features and image tokens do not match"):
        model.model(**model.model_inputs(row["prompt_ids"] + cut, images))

    # mm_tool with the same limit drops the whole tool turn instead: every image is whole, the forward works.
    limited, _, _ = rollout.run(turns, PROMPT, response_length=second_tool_image_end - 3)
    limited_row = unpadded_row(limited)
    assert field(limited, "mm_tool/dropped_turns") == 1
    assert field(limited, "mm_tool/stop_reason") == "length_limit"
    assert placeholder_runs(limited_row["prompt_ids"] + limited_row["response_ids"], image_pad) == [6, 6]
    kept_images = images[:2]
    with torch.no_grad():
        model.model(**model.model_inputs(limited_row["prompt_ids"] + limited_row["response_ids"], kept_images))


# ----- step metrics through the manager ----------------------------------------------------------------------------


def test_manager_adds_mm_tool_step_metrics_to_the_timing_verl_logs(rollout):
    from verl_mm_tools.runtime.batch import make_batch
    from verl_mm_tools.runtime.workers import InProcessActor, make_worker
    from verl_mm_tools.step_hook.manager import MMToolAgentLoopManager
    from verl_mm_tools.testkit.scripted import ScriptedServer

    worker = make_worker(rollout.config(), None)
    worker.llm_client = ScriptedServer(worker.tokenizer, [ROTATE, ROTATE_FIRST, ANSWER])
    manager = MMToolAgentLoopManager.__new__(MMToolAgentLoopManager)  # no Ray: one in-process worker as the actor
    manager.agent_loop_workers = [InProcessActor(worker)]
    output = manager.generate_sequences(make_batch(PROMPT * 2))  # called synchronously, as the trainer does
    timing = output.meta_info["timing"]
    assert timing["mm_tool/images/mean"] == 3.0
    assert timing["mm_tool/image_tokens/mean"] == 18.0
    assert timing["mm_tool/tool_calls/mean"] == 2.0
    assert timing["mm_tool/valid_action_rate"] == 1.0
    assert timing["mm_tool/stop/answered"] == 1.0
    assert timing["mm_tool/tool/rotate/calls_per_trajectory"] == 2.0
    assert "agent_loop/generate_sequences/mean" in timing  # verl's own figures are kept
