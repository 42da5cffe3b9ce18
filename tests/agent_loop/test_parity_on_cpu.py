"""Parity with verl: on a trajectory with no images of ours (a text tool), ``mm_tool`` sets every ``AgentLoopOutput``
field that verl's own ``tool_agent`` sets, equally: tokens, masks, log-probs, MoE ``routed_experts``, multimodal data,
turn counts, tool rewards and verl's extra fields. The server is scripted and returns log-probs and routing; the tiny
Qwen3-VL's template renders tools and tool messages itself, so mm_tool's auto tool format is verl's."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.ray_utils import get_event_loop
from verl.workers.rollout.replica import TokenOutput

from verl_mm_tools.runtime.batch import image_prompt
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.runtime.scripted_client import tool_call_text
from verl_mm_tools.runtime.workers import make_worker, restored_loop_registry
from verl_mm_tools.testkit.scripted import ScriptedServer
from verl_mm_tools.tiny import tiny_model_path

LAYERS, TOP_K = 2, 2
TURNS = [tool_call_text("lookup", key="colour"), tool_call_text("lookup", key="shape"), "It is a red square.<|im_end|>"]
VERL_FIELDS = (
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "num_turns",
    "mm_processor_kwargs",
    "mm_processor_output",
)


def routing(token_count: int, turn: int) -> np.ndarray:
    """A distinct (tokens, layers, top-k) routing per turn, as vLLM returns it for the request's whole sequence."""
    return (np.arange(token_count * LAYERS * TOP_K, dtype=np.int32).reshape(token_count, LAYERS, TOP_K) + turn) % 8


class RoutingServer(ScriptedServer):
    """The scripted server, replying with MoE routing over prompt and generated tokens and a server extra field."""

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, **kwargs) -> TokenOutput:
        turn = self.turns_seen.get(request_id, 0)
        output = await super().generate(
            request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, image_data=image_data, **kwargs
        )
        output.routed_experts = routing(len(prompt_ids) + len(output.token_ids), turn)
        output.extra_fields = {"max_global_steps": 3}
        return output


class LookupTool(BaseTool):
    """A text tool with a step reward: nothing of it is an image."""

    def __init__(self):
        schema = OpenAIFunctionToolSchema.model_validate(
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "Look a fact up.",
                    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
                },
            }
        )
        super().__init__({"type": "native"}, schema)

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=f"{parameters['key']}: red"), 0.25, {}


def build_loop(worker, name: str):
    """The registered loop ``name``, built as verl's worker builds one per trajectory."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry

    return hydra.utils.instantiate(
        config=_agent_loop_registry[name],
        trainer_config=DictConfigWrap(config=worker.config),
        server_manager=RoutingServer(worker.tokenizer, TURNS),
        tokenizer=worker.tokenizer,
        processor=worker.processor,
        hf_model_type=worker.hf_model_type,
        dataset_cls=worker.dataset_cls,
        data_config=DictConfigWrap(worker.config.data),
        tools=ToolListWrap([LookupTool()]),
    )


def run_loop(worker, name: str, prompt: list[dict]):
    """One trajectory through the registered loop ``name``."""
    loop = build_loop(worker, name)
    sampling = {"temperature": 1.0, "top_p": 1.0, "logprobs": True}
    run = loop.run(sampling, raw_prompt=prompt, tools_kwargs={}, extra_info={"index": 0})
    return get_event_loop().run_until_complete(run)  # the loop verl's builder runs on, as the harness uses


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    model = tiny_model_path(family="qwen3_vl")
    config = LocalRollout(model, None, tmp_path_factory.mktemp("parity")).config(response_length=256)
    prompt = image_prompt("What is in the picture?", [Image.new("RGB", (64, 48), (200, 30, 30))])
    with restored_loop_registry():
        worker = make_worker(config, None)
        return (
            run_loop(worker, "tool_agent", prompt),
            run_loop(worker, "mm_tool", prompt),
            build_loop(worker, "mm_tool"),
        )


def test_mm_tool_sets_every_field_tool_agent_sets_equally(outputs):
    verl, ours, _ = outputs
    for field in VERL_FIELDS:
        assert getattr(ours, field) == getattr(verl, field), field
    assert verl.num_turns == 6  # user, then 3 assistant and 2 tool turns
    ours_metrics, verl_metrics = ours.metrics.model_dump(), verl.metrics.model_dump()
    assert ours_metrics.keys() == verl_metrics.keys()  # timings differ run to run; the preemption count does not
    assert ours_metrics["num_preempted"] == verl_metrics["num_preempted"] == 0
    for key, value in verl.extra_fields.items():
        assert ours.extra_fields[key] == value, key
    assert verl.extra_fields["tool_rewards"] == [0.25, 0.25]
    assert verl.extra_fields["max_global_steps"] == 3
    assert ours.multi_modal_data.keys() == verl.multi_modal_data.keys() == {"images"}
    assert [np.asarray(image).tolist() for image in ours.multi_modal_data["images"]] == [
        np.asarray(image).tolist() for image in verl.multi_modal_data["images"]
    ]


def test_routed_experts_reach_the_output_as_verl_cuts_them(outputs):
    verl, ours, _ = outputs
    assert verl.routed_experts is not None
    np.testing.assert_array_equal(ours.routed_experts, verl.routed_experts)
    # the last turn's routing, over the prompt and every response token: what routing replay feeds the trainer
    tokens = len(ours.prompt_ids) + len(ours.response_ids)
    assert ours.routed_experts.shape == (tokens, LAYERS, TOP_K)
    np.testing.assert_array_equal(ours.routed_experts, routing(tokens, 2))


def test_routed_experts_reach_verl_s_batch(tmp_path):
    """Through verl's real worker: the batch holds routing replay's ``routed_experts`` for the mm_tool row."""
    rollout = LocalRollout(tiny_model_path(family="qwen3_vl"), None, tmp_path)
    prompt = image_prompt("What is in the picture?", [Image.new("RGB", (64, 48), (200, 30, 30))])
    with restored_loop_registry():
        worker = make_worker(rollout.config(response_length=256), None)
        worker.tools = [LookupTool()]
        worker.llm_client = RoutingServer(worker.tokenizer, TURNS)
        from verl_mm_tools.runtime.batch import make_batch
        from verl_mm_tools.runtime.workers import generate

        batch = generate(worker, make_batch([prompt]))
    routed = batch.batch["routed_experts"][0]
    attention = batch.batch["attention_mask"][0].bool()
    assert routed.shape[1:] == (LAYERS, TOP_K)
    kept = routed[attention].numpy()
    np.testing.assert_array_equal(kept, routing(len(kept), 2)[: len(kept)])


def test_ignore_termination_lets_a_full_response_go_on_as_verl_s_does(outputs):
    """verl's ``_handle_generating_state(ignore_termination=True)`` does not stop on the response length (a subclass
    asks for it); the mm_tool loop's own limits then ignore it too, while the turn limits still hold."""
    from verl.experimental.agent_loop.tool_agent_loop import AgentData

    loop = outputs[2]
    agent_data = AgentData([], [], None, None, None, {}, "r", {})
    agent_data.response_mask = [1] * loop.response_length
    assert loop._at_limit(agent_data) and not loop._at_limit(agent_data, ignore_termination=True)
    agent_data.assistant_turns = loop.max_assistant_turns
    assert loop._at_limit(agent_data, ignore_termination=True)
