"""A tool that ends the trajectory at a failed call (``END_TRAJECTORY`` in its metrics), through verl's real
AgentLoopWorker: the call is answered, nothing after it runs, the trajectory stops (``tool_failed``) and trains on
what the model generated, nothing masked."""

from __future__ import annotations

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.runtime.batch import image_prompt, unpadded_row
from verl_mm_tools.runtime.scripted_client import tool_call_text
from verl_mm_tools.step_metrics import aggregate_metrics
from verl_mm_tools.testkit.rows import marked_image
from verl_mm_tools.testkit.scripted import ScriptedServer
from verl_mm_tools.tools.base import END_TRAJECTORY

ANSWER = "<answer>90</answer><|im_end|>"
ENDING = 3  # the argument the probe fails on, ending the trajectory
PARALLEL_CALLS = ["actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2"]


class EndingProbe(BaseTool):
    """Answers ``probe says <x>``; on ``x == ENDING`` its call fails and ends the trajectory."""

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
        self.executed: list[int] = []
        self.created: list[str] = []
        self.released: list[str] = []

    async def create(self, instance_id=None, **kwargs):
        self.created.append(f"probe-{len(self.created)}")
        return self.created[-1], ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        self.executed.append(parameters["x"])
        if parameters["x"] == ENDING:
            return ToolResponse(text="Error: x=3 failed"), 0.0, {"error": "x=3 failed", END_TRAJECTORY: True}
        return ToolResponse(text=f"probe says {parameters['x']}"), 0.0, {}

    async def release(self, instance_id, **kwargs):
        self.released.append(instance_id)


def two_calls(first: int, second: int) -> str:
    """One turn calling the probe twice."""
    return tool_call_text("probe", x=first).removesuffix("<|im_end|>") + "\n" + tool_call_text("probe", x=second)


def field(output, key, index=0):
    return output.non_tensor_batch[key][index]


def generated_and_context(row: dict, tokenizer, generated_text: str) -> tuple[int, str]:
    """How many tokens the model generated (``generated_text``) and the text of the context tokens after them."""
    generated = len(tokenizer.encode(generated_text, add_special_tokens=False))
    assert row["response_ids"][:generated] == tokenizer.encode(generated_text, add_special_tokens=False)
    return generated, tokenizer.decode(row["response_ids"][generated:])


def test_the_ending_call_is_answered_and_the_trajectory_trains_on_what_it_generated(rollout):
    """Two trajectories in one batch: one whose call ends it, one that goes on and answers."""

    def server(tokenizer):
        def script(turn, prompt_ids, images):
            ends = "stop here" in tokenizer.decode(prompt_ids)
            return ANSWER if turn else tool_call_text("probe", x=ENDING if ends else 1)

        return ScriptedServer(tokenizer, script)

    probe = EndingProbe()
    prompts = [image_prompt(f"{words}: how far is this rotated?", [marked_image()]) for words in ("stop here", "go on")]
    output, backend, worker = rollout.run(None, prompts, tools=[probe], server=server)

    row = unpadded_row(output, 0)
    generated, context = generated_and_context(row, worker.tokenizer, tool_call_text("probe", x=ENDING))
    assert context == (
        "\n<|im_start|>user\n<tool_response>\nError: x=3 failed\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert row["response_mask"] == [1] * generated + [0] * (len(row["response_ids"]) - generated)
    assert list(output.non_tensor_batch["mm_tool/stop_reason"]) == ["tool_failed", "answered"]
    assert list(output.non_tensor_batch["__num_turns__"]) == [3, 4]  # prompt, call, answer (then the model's answer)
    assert list(output.non_tensor_batch["mm_tool/masked"]) == [0, 0]
    assert list(output.non_tensor_batch["mm_tool/error"]) == ["", ""]
    assert field(output, "mm_tool/turn_spans") == [[0, generated]]
    assert len(backend.requests) == 3  # one generation for the ended trajectory, two for the other
    assert sorted(probe.executed) == [1, ENDING]
    assert sorted(probe.created) == sorted(probe.released) == ["probe-0", "probe-1"]

    metrics = aggregate_metrics(SampleFields.every_row(output.non_tensor_batch))
    assert (metrics["mm_tool/stop/tool_failed"], metrics["mm_tool/stop/answered"]) == (0.5, 0.5)
    assert (metrics["mm_tool/stop/error"], metrics["mm_tool/masked/count"]) == (0.0, 0.0)
    assert metrics["mm_tool/tool/probe/error_rate"] == 0.5


def test_calls_after_the_ending_call_are_answered_but_not_run(rollout):
    probe = EndingProbe()
    output, backend, worker = rollout.run(
        [two_calls(ENDING, 4), ANSWER], [image_prompt("Q?", [marked_image()])], tools=[probe], extra=PARALLEL_CALLS
    )
    row = unpadded_row(output)
    generated, context = generated_and_context(row, worker.tokenizer, two_calls(ENDING, 4))
    assert context == (
        "\n<|im_start|>user\n<tool_response>\nError: x=3 failed\n</tool_response>\n<tool_response>\n"
        "Error: this call was not run: the failed 'probe' call before it ended the conversation.\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert row["response_mask"] == [1] * generated + [0] * (len(row["response_ids"]) - generated)
    assert probe.executed == [ENDING] and len(backend.requests) == 1
    assert (field(output, "mm_tool/stop_reason"), field(output, "mm_tool/masked")) == ("tool_failed", 0)
    assert (field(output, "mm_tool/tool_calls"), field(output, "mm_tool/ignored_calls")) == (1, 1)
    assert field(output, "mm_tool/per_tool")["probe"]["calls"] == 1


def test_calls_before_the_ending_call_run_as_usual(rollout):
    probe = EndingProbe()
    output, _, _ = rollout.run(
        [two_calls(1, ENDING), ANSWER], [image_prompt("Q?", [marked_image()])], tools=[probe], extra=PARALLEL_CALLS
    )
    assert probe.executed == [1, ENDING]
    assert (field(output, "mm_tool/tool_calls"), field(output, "mm_tool/ignored_calls")) == (2, 0)
    assert (field(output, "mm_tool/stop_reason"), field(output, "mm_tool/tool_errors")) == ("tool_failed", 1)


def test_an_ending_answer_that_does_not_fit_is_dropped_and_the_stop_reason_stays_the_tools(rollout):
    """The answer would pass the response budget: the turn is dropped as any such turn, the generated call still
    trains, and the trajectory says the tool ended it."""
    call = tool_call_text("probe", x=ENDING)
    probe = EndingProbe()
    output, _, worker = rollout.run(
        [call, ANSWER], [image_prompt("Q?", [marked_image()])], tools=[probe], response_length=48
    )
    row = unpadded_row(output)
    generated = len(worker.tokenizer.encode(call, add_special_tokens=False))
    assert generated < 48 and row["response_mask"] == [1] * generated
    assert (field(output, "mm_tool/stop_reason"), field(output, "mm_tool/dropped_turns")) == ("tool_failed", 1)
    assert field(output, "mm_tool/masked") == 0
