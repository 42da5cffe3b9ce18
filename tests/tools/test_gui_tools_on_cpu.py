"""The GUI tools through the real mm_tool loop (verl's AgentLoopWorker, the tiny Qwen2.5-VL's processor and chat
template, verl's reward worker) on MiniWoB++ in real Chromium: the oracle solves every offered task, a point on the
shown screenshot lands on the page exactly, bad actions are answered as text, and a browser that dies masks only its
own trajectory."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from verl_mm_tools.agent_loop.hook_config import MANAGER_TQ_OVERRIDE
from verl_mm_tools.envs import Sample, check_gui_tool
from verl_mm_tools.envs.gui.miniwob_env import ACTIVE_EPISODE, OFFERED_TASKS, POOL, MiniWoBEnv
from verl_mm_tools.files import STATE_ATTR, FileRoots
from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.runtime.batch import unpadded_row
from verl_mm_tools.runtime.miniwob_oracle import oracle_script
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.runtime.scripted_client import tool_call_text
from verl_mm_tools.tools import ToolCheckError, check_tool
from verl_mm_tools.tools.gui_tools import GUI_TOOLS, ClickTool, PressTool, TypeTool
from verl_mm_tools.workspace import ImageWorkspace

pytestmark = pytest.mark.integration  # the tiny model's processor, verl's worker and Chromium

GUI_TOOLS_YAML = Path(__file__).parents[2] / "examples" / "tools" / "gui_tools.yaml"
REWARD = ["reward.reward_manager.name=mm_turn_discount", "+reward.reward_kwargs.gamma=1.0"]
EPISODES_PER_TASK = 5


@pytest.fixture
def gui_rollout(tiny_model_dir, tmp_path):
    return LocalRollout(tiny_model_dir, GUI_TOOLS_YAML, tmp_path)


def run_miniwob(rollout: LocalRollout, script, tasks: list[str], seeds: list[int], **kwargs):
    """The rollout of one trajectory per (task, seed), scripted by ``script``."""
    prompts, columns = miniwob_rows(tasks, seeds)
    return rollout.run(script, prompts, columns=columns, **kwargs)


def miniwob_rows(tasks: list[str], seeds: list[int]) -> tuple[list[list[dict]], dict]:
    prompts = [[{"role": "user", "content": [{"type": "text", "text": "Do the task on the page."}]}] for _ in tasks]
    columns = {
        "data_source": [f"miniwob/{task}" for task in tasks],
        "reward_model": [{"style": "rule", "ground_truth": ""} for _ in tasks],
        "extra_info": [
            {"index": i, "seed": seed, "env": {"name": "miniwob", "task": task}, "reward_fn": "environment_reward"}
            for i, (task, seed) in enumerate(zip(tasks, seeds))
        ],
    }
    return prompts, columns


def test_the_oracle_solves_every_offered_task_through_the_loop(gui_rollout):
    tasks = list(OFFERED_TASKS)
    solved: dict[str, list[bool]] = {task: [] for task in tasks}
    calls: dict[str, set[int]] = {task: set() for task in tasks}
    sizes = set()
    launched = POOL.launched
    for wave in range(EPISODES_PER_TASK):  # a wave's browsers serve the next wave (the pool)
        seeds = [wave * len(tasks) + i for i in range(len(tasks))]
        output, server, _ = run_miniwob(gui_rollout, oracle_script, tasks, seeds, score=True, extra=REWARD, max_turns=6)
        assert set(output.non_tensor_batch["mm_tool/stop_reason"]) == {"episode_done"}
        for task, score, count in zip(
            tasks, output.batch["rm_scores"].sum(-1).tolist(), output.non_tensor_batch["tool_call_counts"]
        ):
            solved[task].append(score == 1.0)
            calls[task].add(int(count))
        sizes |= {image.size for request in server.requests for image in request["images"]}
    assert {task: sum(done) / len(done) for task, done in solved.items()} == dict.fromkeys(tasks, 1.0)
    # one click solves a click task; enter-text takes three actions (click the field, type, click Submit)
    assert calls == {task: ({3} if task == "enter-text" else {1}) for task in tasks}
    # every request showed the screenshots at the size the processor keeps: 160x210 px pages as 168x224
    assert sizes == {(168, 224)}
    assert POOL.launched - launched <= len(tasks)


def test_with_keep_last_images_each_turn_sees_only_the_latest_screenshot(gui_rollout):
    """enter-text takes three actions (the last ends the episode): with keep_last_images=1 every turn's context holds
    one screenshot (earlier ones as notes), each turn is a sample of its own holding it, and the oracle still solves
    it."""
    output, server, worker = run_miniwob(
        gui_rollout,
        oracle_script,
        ["enter-text"],
        [7],
        per_sample=True,
        score=True,
        loop_options={"keep_last_images": 1},
        extra=("trainer.use_v1=true", MANAGER_TQ_OVERRIDE, *REWARD),
        max_turns=6,
    )
    assert [len(request["images"]) for request in server.requests] == [1, 1, 1]
    assert [fields.sample for fields in SampleFields.every_row(output.non_tensor_batch)] == [[k, 3] for k in range(3)]
    assert [len(inputs["image_grid_thw"]) for inputs in output.non_tensor_batch["multi_modal_inputs"]] == [1, 1, 1]
    assert output.non_tensor_batch["mm_tool/stop_reason"][-1] == "episode_done"
    assert output.batch["rm_scores"][-1].sum().item() == 1.0
    # the later samples' prompts are wider than rollout.prompt_length: the first row holds verl's own left pads (to
    # it) and the batch's (to the widest), with the same position ids
    pads = output.batch["attention_mask"][0] == 0
    assert output.batch["prompts"].size(1) > 1024 and pads.sum() > output.batch["prompts"].size(1) - 1024
    assert [set(row[pads].tolist()) for row in output.batch["position_ids"][0]] == [{1}, {0}, {0}, {0}]
    last_prompt = worker.tokenizer.decode(server.requests[-1]["prompt_ids"])
    assert all(f"(Image {n} is no longer shown.)" in last_prompt for n in (1, 2))


def test_a_point_on_the_shown_screenshot_lands_on_the_page_exactly(gui_rollout):
    clicks: list[list[float]] = []

    def script(turn, prompt_ids, images):
        driver = ACTIVE_EPISODE.get().browser.gym.gym_instance.driver
        if turn == 0:
            driver.execute_script(
                "window.vmtClicks = [];"
                "document.addEventListener('mousedown', (e) => window.vmtClicks.push([e.clientX, e.clientY]), true);"
            )
            return tool_call_text("click", x=84, y=112)  # shown at 168x224: the page's (80, 105)
        clicks.extend(driver.execute_script("return window.vmtClicks;"))
        return "Done.<|im_end|>"

    output, server, worker = run_miniwob(gui_rollout, script, ["click-test"], [0], max_turns=3)
    assert clicks == [[80, 105]]
    answer = worker.tokenizer.decode(server.requests[1]["prompt_ids"]).rsplit("<|vision_end|>", 1)[1]
    assert answer.startswith("Image 2: the page after clicking at (84, 112).")
    assert [image.size for image in server.requests[1]["images"]] == [(168, 224), (168, 224)]


def test_bad_actions_are_answered_as_text_and_the_episode_goes_on(gui_rollout):
    bad_calls = [
        tool_call_text("click", x=500, y=10),
        tool_call_text("click", x="left", y=10),
        tool_call_text("press", key="F13"),
        tool_call_text("type", text="a" * 300),  # 100,000 characters do not fit a response: see the next test
    ]

    def script(turn, prompt_ids, images):
        return bad_calls[turn] if turn < len(bad_calls) else oracle_script(turn, prompt_ids, images)

    output, server, worker = run_miniwob(
        gui_rollout, script, ["click-button"], [3], score=True, extra=REWARD, max_turns=6, response_length=2048
    )
    answers = [
        worker.tokenizer.decode(request["prompt_ids"]).rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
        for request in server.requests[1:5]
    ]
    assert answers == [
        "Error from click: the point (500, 10) is off the screenshot, which is 168x224 px: x must be in [0, 168) "
        "and y in [0, 224)",
        "Error from click: x must be a number, got 'left' (a string)",
        "Error from press: unknown key 'F13'; press one printable character or one of ['Enter', 'Tab', 'Backspace', "
        "'Delete', 'Escape', 'Space', 'ArrowUp', 'ArrowDown', 'ArrowLeft', 'ArrowRight', 'Home', 'End', 'PageUp', "
        "'PageDown']",
        "Error from type: text may have at most 200 characters, got 300",
    ]
    assert [len(request["images"]) for request in server.requests] == [1, 1, 1, 1, 1]  # no action, no screenshot
    assert output.non_tensor_batch["mm_tool/tool_errors"][0] == 4
    assert output.non_tensor_batch["mm_tool/stop_reason"][0] == "episode_done"
    assert output.batch["rm_scores"][0].sum().item() == 1.0


def test_the_environments_reward_scores_the_trajectory(gui_rollout):
    """Solved: MiniWoB's 1; an answer without acting: -1 (its time-out); out of turns before the end: -1."""

    def script(turn, prompt_ids, images):
        task = ACTIVE_EPISODE.get().task
        if task == "click-test":
            return oracle_script(turn, prompt_ids, images)
        if task == "click-button":
            return "I would click the button.<|im_end|>"
        return tool_call_text("click", x=1, y=1)  # focus-text: a click on nothing, until the turn limit

    output, _, _ = run_miniwob(
        gui_rollout, script, ["click-test", "click-button", "focus-text"], [0, 1, 2], score=True, extra=REWARD
    )
    assert output.batch["rm_scores"].sum(-1).tolist() == [1.0, -1.0, -1.0]
    assert list(output.non_tensor_batch["mm_tool/stop_reason"]) == ["episode_done", "answered", "turn_limit"]
    assert list(output.non_tensor_batch["reason"]) == ["ended", "ended", "turn_limit"]


def test_a_browser_that_dies_masks_only_its_own_trajectory(gui_rollout):
    def script(turn, prompt_ids, images):
        env = ACTIVE_EPISODE.get()
        if env.task == "click-test":
            env.browser.kill()  # Chromium and chromedriver gone before this trajectory's action
            return tool_call_text("click", x=10, y=10)
        return oracle_script(turn, prompt_ids, images)

    output, _, _ = run_miniwob(gui_rollout, script, ["click-test", "click-button"], [0, 1], score=True, extra=REWARD)
    stops = list(output.non_tensor_batch["mm_tool/stop_reason"])
    assert stops == ["error", "episode_done"]
    assert "BrowserLost: miniwob click-test: the browser failed" in output.non_tensor_batch["mm_tool/error"][0]
    assert sum(unpadded_row(output, 0)["response_mask"]) == 0  # trained on nothing
    assert np.isclose(output.batch["rm_scores"][1].sum().item(), 1.0)


def test_a_gui_tool_without_a_screen_answers_so(gui_rollout):
    prompts = [[{"role": "user", "content": [{"type": "text", "text": "Click somewhere."}]}]]
    output, server, worker = gui_rollout.run([tool_call_text("click", x=1, y=1), "No page.<|im_end|>"], prompts)
    answer = worker.tokenizer.decode(server.requests[1]["prompt_ids"])
    assert "Error from click: this tool acts on a GUI environment's page, and this conversation has no environment" in (
        answer
    )


def test_type_and_press_reach_the_page_and_long_text_never_does(execute):
    async def episode():
        env = MiniWoBEnv("enter-text")
        observation = await env.reset(Sample(data_source=None, ground_truth=None, extra_info={"seed": 5}))
        return env, observation.images[0]

    env, screenshot = asyncio.run(episode())
    context = SimpleNamespace(workspace=ImageWorkspace([screenshot]), files=FileRoots(), env=env)
    agent_data = SimpleNamespace(**{STATE_ATTR: context})
    try:
        field = next(e for e in env.observation["dom_elements"] if e["tag"] == "input_text")
        x, y = float(field["left"][0]) + 5, float(field["top"][0]) + 5
        response, reward, metrics = execute(ClickTool(), {"x": x, "y": y}, agent_data)
        assert response.text == f"Image 2: the page after clicking at ({x:g}, {y:g})." and metrics == {"reward": 0.0}
        response, _, metrics = execute(TypeTool(), {"text": "a" * 100_000}, agent_data)
        assert response.text == "Error from type: text may have at most 200 characters, got 100000"
        assert metrics == {"error": "text may have at most 200 characters, got 100000"}
        execute(TypeTool(), {"text": "abc"}, agent_data)
        execute(PressTool(), {"key": "Backspace"}, agent_data)
        field = next(e for e in env.observation["dom_elements"] if e["tag"] == "input_text")
        assert field["value"] == "ab"
    finally:
        asyncio.run(env.close())


@pytest.mark.parametrize("tool_class", GUI_TOOLS, ids=lambda tool: tool.__name__)
def test_check_gui_tool_runs_the_tool_contract_on_a_real_page(tool_class):
    report = str(check_gui_tool(tool_class(), MiniWoBEnv("click-test")))
    assert "on a 160x210 image returns images within max_pixels and a text starting 'Image 2:'" in report
    assert "bad input answered as text: no image in the conversation" in report


def test_check_tool_names_check_gui_tool_for_a_gui_tool():
    with pytest.raises(ToolCheckError, match=r"check it with verl_mm_tools.envs.check_gui_tool\(tool, environment\)"):
        check_tool(ClickTool())
