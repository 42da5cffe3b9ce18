"""Fault injection in one verl batch: tools that raise, hang past the timeout, cancel themselves or answer garbage;
environments that raise in reset, step or close; an inference server that raises mid-trajectory. The batch through
``AgentLoopWorker.generate_sequences`` completes, exactly the affected samples are masked and counted, the model is
told about a hung call, and every tool session and environment is closed exactly once."""

from __future__ import annotations

import asyncio

import pytest
from PIL import Image
from reliability_helpers import (
    ABORTED,
    ENV_LOG,
    PicTool,
    ScriptedTool,
    marked_prompt,
    recorded,
    register_test_environments,
    run_batch,
    sample_tools_kwargs,
    trajectory_violations,
)
from verl.tools.schemas import ToolResponse
from vllm.v1.engine.exceptions import EngineDeadError

from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.step_hook.manager import step_batch
from verl_mm_tools.step_hook.step import MaskedBatchError, process_step
from verl_mm_tools.step_metrics import aggregate_metrics

ANSWER = "<answer>3</answer><|im_end|>"
TIMEOUT_S = 0.2


def call(name: str, **arguments) -> str:
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call><|im_end|>"


async def raises(parameters):
    raise RuntimeError("tool exploded")


CANCELLED: list[str] = []


async def hangs(parameters):
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        CANCELLED.append("hangs")
        raise


async def ignores_cancellation(parameters):
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        CANCELLED.append("stubborn")
        await asyncio.sleep(1.5)  # keeps running past the loop's grace period


async def cancels_itself(parameters):
    raise asyncio.CancelledError()  # e.g. a tool that cancels its own sub-task and lets the error escape


async def times_out_itself(parameters):
    raise TimeoutError("backend timed out")  # the tool's own timeout, not the loop's


async def answers_garbage(parameters):
    return "not a (ToolResponse, reward, metrics) tuple"


async def answers_a_non_image(parameters):
    return ToolResponse(image=["not an image"], text="here"), 0.0, {}


async def creates_then_works(parameters):
    return ToolResponse(text="fine"), 0.0, {}


FAULTY_TOOLS = [
    ScriptedTool("raises", raises),
    ScriptedTool("hangs", hangs),
    ScriptedTool("stubborn", ignores_cancellation),
    ScriptedTool("cancels", cancels_itself),
    ScriptedTool("times_out", times_out_itself),
    ScriptedTool("garbage", answers_garbage),
    ScriptedTool("non_image", answers_a_non_image),
    ScriptedTool("fine", creates_then_works),
    ScriptedTool("create_fails", creates_then_works, fail_in="create"),
    ScriptedTool("release_fails", creates_then_works, fail_in="release"),
    PicTool(),
]

# sample: (script, env spec or None, masked, error prefix)
CASES = {
    "good": ([call("fine"), call("pic", w=60, h=40), ANSWER], None, 0, ""),
    "tool raises": (
        [call("fine"), call("raises")],
        None,
        1,
        "ToolCrashError: tool 'raises' raised RuntimeError: tool exploded",
    ),
    "tool hangs": ([call("hangs"), ANSWER], None, 0, ""),
    "tool ignores cancellation": ([call("stubborn"), ANSWER], None, 0, ""),
    "tool cancels itself": ([call("cancels"), ANSWER], None, 1, "ToolCrashError: tool 'cancels' raised CancelledError"),
    "tool times out itself": (
        [call("times_out"), ANSWER],
        None,
        1,
        "ToolCrashError: tool 'times_out' raised TimeoutError: backend timed out",
    ),
    "tool answers garbage": ([call("garbage"), ANSWER], None, 1, "ToolCrashError: tool 'garbage' raised ValueError"),
    "tool answers a non-image": ([call("non_image"), ANSWER], None, 0, ""),
    "tool create raises": (
        [call("create_fails"), ANSWER],
        None,
        1,
        "ToolCrashError: tool 'create_fails' raised RuntimeError: create_fails: create failed",
    ),
    "tool release raises": ([call("release_fails"), call("fine"), ANSWER], None, 0, ""),
    "env init raises": (
        [ANSWER],
        {"name": "reliability_faulty", "fail_in": "init"},
        1,
        "RuntimeError: environment failed in init",
    ),
    "env reset raises": (
        [ANSWER],
        {"name": "reliability_faulty", "fail_in": "reset"},
        1,
        "RuntimeError: environment failed in reset",
    ),
    "env step raises": (
        [call("fine"), ANSWER],
        {"name": "reliability_faulty", "fail_in": "step"},
        1,
        "RuntimeError: environment failed in step",
    ),
    "env close raises": ([ANSWER, ANSWER], {"name": "reliability_faulty", "fail_in": "close", "answers": 2}, 0, ""),
    "server raises": ([call("fine"), "SERVER FAILS", ANSWER], None, 1, "RuntimeError: inference server failed"),
    "server raises at once": (["SERVER FAILS"], None, 1, "RuntimeError: inference server failed"),
    "server request cancelled": ([call("fine"), "SERVER CANCELS"], None, 1, "CancelledError"),
    "engine aborts a request": (
        [call("fine"), ABORTED + "<answer>"],
        None,
        1,
        "EngineAbortedError: the rollout engine aborted generation 2 of the trajectory after 3 tokens",
    ),
    "engine aborts at once": (
        [ABORTED],
        None,
        1,
        "EngineAbortedError: the rollout engine aborted generation 1 of the trajectory after 0 tokens",
    ),
    "engine dead": ([call("fine"), "ENGINE DIES"], None, 1, "EngineDeadError: EngineCore encountered an issue"),
}


def script_for(names: list[str]):
    def script(sample: int, turn: int, images: list) -> str:
        turns = CASES[names[sample]][0]
        text = turns[min(turn, len(turns) - 1)]
        if text == "SERVER FAILS":
            raise RuntimeError("inference server failed")
        if text == "SERVER CANCELS":  # e.g. a client whose request was aborted on the server side
            raise asyncio.CancelledError()
        if text == "ENGINE DIES":  # what vLLM's AsyncLLM raises for every request once its engine process died
            raise EngineDeadError()
        return text

    return script


@pytest.fixture(scope="module")
def faulty_batch(tiny_model_dir, tmp_path_factory):
    register_test_environments()
    ENV_LOG.reset.clear(), ENV_LOG.closed.clear(), CANCELLED.clear()
    names = list(CASES) * 2  # each case twice, so a fault cannot hide behind a lucky position
    tools, lifecycle = recorded(FAULTY_TOOLS)
    columns = {
        "tools_kwargs": sample_tools_kwargs(tools, len(names)),
        "extra_info": [{"index": index, "env": CASES[name][1]} for index, name in enumerate(names)],
    }
    prompts = [marked_prompt(index, name, [Image.new("RGB", (56, 56), "gray")]) for index, name in enumerate(names)]
    batch = run_batch(
        tiny_model_dir,
        tmp_path_factory.mktemp("faults"),
        tools=tools,
        prompts=prompts,
        script=script_for(names),
        columns=columns,
        loop_options={"tool_timeout_s": TIMEOUT_S},
        prompt_length=2048,
        response_length=512,
    )
    return names, batch, lifecycle


def test_the_batch_completes_with_exactly_the_affected_samples_masked(faulty_batch):
    names, batch, _ = faulty_batch
    assert len(batch.output) == len(names)
    assert batch.field("mm_tool/masked") == [CASES[name][2] for name in names]
    for index, name in enumerate(names):
        assert batch.field("mm_tool/error")[index].startswith(CASES[name][3]), (
            name,
            batch.field("mm_tool/error")[index],
        )
        assert trajectory_violations(batch, index) == [], name
    masked = sum(CASES[name][2] for name in names)
    assert aggregate_metrics(SampleFields.every_row(batch.output.non_tensor_batch))["mm_tool/masked/count"] == float(
        masked
    )


def test_no_session_or_environment_leaks_whatever_failed(faulty_batch):
    names, _, lifecycle = faulty_batch
    assert lifecycle.leaks() == []
    started = [index for index, name in enumerate(names) if CASES[name][1] and CASES[name][1]["fail_in"] != "init"]
    assert sorted(ENV_LOG.reset) == sorted(ENV_LOG.closed) == started


@pytest.mark.parametrize("case, tool", [("tool hangs", "hangs"), ("tool ignores cancellation", "stubborn")])
def test_a_hung_call_is_cancelled_and_the_model_told(faulty_batch, case, tool):
    names, batch, _ = faulty_batch
    for index in (i for i, name in enumerate(names) if name == case):
        response = batch.worker.tokenizer.decode(batch.output.batch["responses"][index])
        assert f"Error: tool '{tool}' took longer than {TIMEOUT_S:g} s and was cancelled" in response
        assert batch.field("mm_tool/tool_errors")[index] == 1
        assert batch.field("mm_tool/stop_reason")[index] == "answered"
    assert CANCELLED.count(tool) == names.count(case)


def test_a_non_image_from_a_tool_is_dropped_with_a_note(faulty_batch):
    names, batch, _ = faulty_batch
    index = names.index("tool answers a non-image")
    response = batch.worker.tokenizer.decode(batch.output.batch["responses"][index])
    assert "Note: the tool returned a str instead of an image; it was dropped." in response
    assert batch.field("mm_tool/images")[index] == 1


def test_prefix_cache_hits_are_counted_from_the_second_generation(faulty_batch):
    """The engine's per-request prefix-cache hits (verl's ``num_cached_tokens``) reach the trajectory's counters
    from its second generation on, masked trajectories included (the engine did the work), and the step's hit rate
    is their ratio."""
    names, batch, _ = faulty_batch
    prompt, cached = batch.field("mm_tool/later_prompt_tokens"), batch.field("mm_tool/later_cached_tokens")
    for index, name in enumerate(names):
        later = batch.server.generations[index][1:]
        if name.startswith("engine aborts"):
            later = later[:-1]  # the aborted generation raised before its reply was kept
        assert (prompt[index], cached[index]) == (
            sum(g.prompt_tokens for g in later),
            sum(g.cached_tokens for g in later),
        ), name
    good = names.index("good")
    assert prompt[good] > cached[good] > 0  # the history up to the last full 16-token block
    assert aggregate_metrics(SampleFields.every_row(batch.output.non_tensor_batch))[
        "mm_tool/prefix_cache_hit_rate"
    ] == sum(cached) / sum(prompt)


def test_a_batch_whose_engine_died_stops_the_step_naming_the_engine(tiny_model_dir, tmp_path):
    """Every trajectory's generation raises vLLM's EngineDeadError (its engine process died mid-step, as measured
    in docs/vllm_rollout.md): every trajectory is masked, and the step hook stops the run with the engine's error
    and where to read why, not advice about the data."""
    names = ["engine dead"] * 4
    prompts = [marked_prompt(index, name) for index, name in enumerate(names)]
    batch = run_batch(
        tiny_model_dir,
        tmp_path,
        tools=[PicTool()],
        prompts=prompts,
        script=script_for(names),
        prompt_length=2048,
        response_length=512,
    )
    assert batch.field("mm_tool/masked") == [1, 1, 1, 1]
    with pytest.raises(MaskedBatchError) as raised:
        process_step(step_batch(batch.output, {"global_steps": 4, "validate": False}))
    message = str(raised.value)
    assert message.startswith("4 of 4 mm_tool trajectories of training step 4 were masked")
    assert "EngineDeadError: EngineCore encountered an issue" in message
    assert message.endswith(
        "its own log (the rollout server's lines in the trainer's log: vLLMHttpServer, "
        "EngineCore) says why it died or aborted the requests."
    )
