"""Shared pieces of the reliability tests.

- the six image tools with one-word schemas (a short system prompt keeps a thousand trajectories cheap), plus
  ``pic`` (answers with an image of any size and mode) and tools that misbehave on purpose;
- ``Lifecycle``: which tool instances were created and released, per sample;
- ``RecordingServer``: a scripted inference server that remembers every token it generated, per sample;
- ``run_batch``: one batch through verl's real ``AgentLoopWorker.generate_sequences``;
- ``trajectory_violations``: the invariants of one output row, recomputed from the DataProto verl returns (its token
  tensors and its ``multi_modal_inputs``), not taken from the loop's own validator.
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.workers.rollout.replica import TokenOutput

from verl_mm_tools.runtime.batch import make_batch
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.runtime.workers import generate, make_worker, restored_loop_registry
from verl_mm_tools.testkit.scripted import prefix_cache_hits
from verl_mm_tools.tools import BUILTIN_TOOLS, build_schema

MARKER = re.compile(r"\[sample (\d+)\]")
MERGE = 2  # the tiny Qwen2.5-VL's spatial merge size
PATCH = 14


# ----- tools ------------------------------------------------------------------------------------------------------


def short_schema(name: str, parameters: dict[str, str], required: Sequence[str]) -> OpenAIFunctionToolSchema:
    """A schema with one-word descriptions: the tools' real descriptions would triple every prompt."""
    properties = {key: {"type": kind, "description": key} for key, kind in parameters.items()}
    return OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": name,
                "description": name,
                "parameters": {"type": "object", "properties": properties, "required": list(required)},
            },
        }
    )


def image_tools(max_pixels: int = 39200) -> list[BaseTool]:
    """The six shipped tools, their real arguments and behaviour, with short schemas."""
    tools = []
    for tool_cls in BUILTIN_TOOLS:
        full = build_schema(tool_cls.schema_fn).function
        kinds = {key: prop.type for key, prop in full.parameters.properties.items()}
        tools.append(
            tool_cls(
                {"type": "native", "max_pixels": max_pixels}, short_schema(full.name, kinds, full.parameters.required)
            )
        )
    return tools


class PicTool(BaseTool):
    """``pic(w, h, mode)``: answers with a new image of that size and PIL mode (any size, any mode)."""

    def __init__(self):
        self.config, self.name = {}, "pic"
        self.tool_schema = short_schema("pic", {"w": "integer", "h": "integer", "mode": "string"}, ["w", "h"])

    async def execute(self, instance_id, parameters, **kwargs):
        size, mode = (parameters["w"], parameters["h"]), parameters.get("mode", "RGB")
        return ToolResponse(image=[Image.new(mode, size, 200)], text=f"a {mode} picture"), 0.0, {}


class ScriptedTool(BaseTool):
    """A tool whose ``execute`` is any coroutine function ``behave(parameters)``: raising, hanging, odd outputs.
    ``fail_in`` ("create" or "release") makes that lifecycle call raise."""

    def __init__(self, name: str, behave: Callable[[dict], Any], fail_in: str = ""):
        self.config, self.name, self.behave, self.fail_in = {}, name, behave, fail_in
        self.tool_schema = short_schema(name, {"x": "integer"}, [])

    async def create(self, instance_id=None, **kwargs):
        if self.fail_in == "create":
            raise RuntimeError(f"{self.name}: create failed")
        return await super().create(instance_id, **kwargs)

    async def execute(self, instance_id, parameters, **kwargs):
        return await self.behave(parameters)

    async def release(self, instance_id, **kwargs):
        if self.fail_in == "release":
            raise RuntimeError(f"{self.name}: release failed")


@dataclass
class Lifecycle:
    """Tool instances created and released, with the sample that created each (from its ``create_kwargs``)."""

    created: list[tuple[str, str, Any]] = field(default_factory=list)
    released: list[tuple[str, str]] = field(default_factory=list)
    executed: dict[Any, int] = field(default_factory=lambda: defaultdict(int))

    def leaks(self) -> list[str]:
        """Every instance not released exactly once (empty when sessions are sound)."""
        created = [(tool, instance) for tool, instance, _ in self.created]
        problems = [
            f"{key} released {self.released.count(key)} times" for key in created if self.released.count(key) != 1
        ]
        problems += [f"{key} released but never created" for key in set(self.released) - set(created)]
        if len(set(created)) != len(created):
            problems.append("an instance id was created twice")
        return problems


class Recorded(BaseTool):
    """Delegates to ``inner`` and records its lifecycle in ``log``."""

    def __init__(self, inner: BaseTool, log: Lifecycle):
        self.inner, self.log = inner, log
        self.config, self.tool_schema, self.name = inner.config, inner.tool_schema, inner.name
        self.sample_of: dict[str, Any] = {}

    async def create(self, instance_id=None, **kwargs):
        instance_id, response = await self.inner.create(instance_id, **kwargs)
        sample = (kwargs.get("create_kwargs") or {}).get("sample")
        self.sample_of[instance_id] = sample
        self.log.created.append((self.name, instance_id, sample))
        return instance_id, response

    async def execute(self, instance_id, parameters, **kwargs):
        self.log.executed[self.sample_of.get(instance_id)] += 1
        return await self.inner.execute(instance_id, parameters, **kwargs)

    async def release(self, instance_id, **kwargs):
        self.log.released.append((self.name, instance_id))
        return await self.inner.release(instance_id, **kwargs)


def recorded(tools: Sequence[BaseTool]) -> tuple[list[Recorded], Lifecycle]:
    log = Lifecycle()
    return [Recorded(tool, log) for tool in tools], log


def sample_tools_kwargs(tools: Sequence[BaseTool], count: int) -> list[dict]:
    """The ``tools_kwargs`` column that tells each created instance its sample number."""
    return [{tool.name: {"create_kwargs": {"sample": index}} for tool in tools} for index in range(count)]


# ----- environments -----------------------------------------------------------------------------------------------


@dataclass
class EnvLog:
    """Environments started and closed, process-wide (the loop builds them from a registered name)."""

    reset: list[int] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)


ENV_LOG = EnvLog()


def register_test_environments() -> None:
    """``reliability_faulty``: raises in ``fail_in`` (init, reset, step or close), else is done after ``answers``;
    ``reliability_counting``: done after ``answers`` answers, shows an image of ``image_size`` after each other one
    (both log their lifecycle in ``ENV_LOG``); ``reliability_reader``: opens ``path`` through ``sample.files``."""
    from verl_mm_tools.envs import ENVIRONMENTS, Environment, Observation, register_environment

    if "reliability_faulty" in ENVIRONMENTS:
        return

    class Logged(Environment):
        def __init__(self, fail_in: str = "", answers: int = 1, image_size: list | None = None):
            self.fail_in, self.answers, self.image_size, self.sample, self.steps = fail_in, answers, image_size, None, 0
            self._maybe_fail("init")

        def _maybe_fail(self, where: str) -> None:
            if self.fail_in == where:
                raise RuntimeError(f"environment failed in {where}")

        def reset(self, sample):
            self.sample = (sample.extra_info or {}).get("index")
            ENV_LOG.reset.append(self.sample)
            self._maybe_fail("reset")

        def step(self, assistant_text):
            self._maybe_fail("step")
            self.steps += 1
            done = self.steps >= self.answers
            images = (Image.new("RGB", tuple(self.image_size), 90),) if self.image_size and not done else ()
            return Observation(text="try again", images=images), float(done), done, {"steps": self.steps}

        def close(self):
            ENV_LOG.closed.append(self.sample)
            self._maybe_fail("close")

    class Reader(Environment):
        """Opens ``path`` in reset, through the trajectory's file roots, as any environment reading files must."""

        name = "reliability_reader"

        def __init__(self, path: str):
            self.path = path

        def reset(self, sample):
            return Observation(text="reference", images=(sample.files.open_image(self.path),))

        def step(self, assistant_text):
            return Observation(), 1.0, True, {}

    register_environment(type("FaultyEnv", (Logged,), {"name": "reliability_faulty"}))
    register_environment(type("CountingEnv", (Logged,), {"name": "reliability_counting"}))
    register_environment(Reader)


# ----- server -----------------------------------------------------------------------------------------------------


ABORTED = "ENGINE ABORTS:"  # a scripted turn starting with this is answered as an aborted request


@dataclass
class Generation:
    token_ids: list[int]
    log_probs: list[float]
    images: list[Image.Image]
    prompt_tokens: int = 0
    cached_tokens: int = 0


def server_logprob(position: int) -> float:
    return -0.01 * (position + 1)


class RecordingServer:
    """Answers turn k of sample s with ``script(s, k, images)`` (text; raising makes the server raise; ``ABORTED``
    then text: an aborted request that generated that text) and records what it generated per sample, with the
    prefix-cache hits a block cache would report. A sample is recognized by the ``[sample N]`` marker in its first
    prompt."""

    def __init__(self, tokenizer, script: Callable[[int, int, list], str]):
        self.tokenizer, self.script = tokenizer, script
        self.sample_of: dict[str, int] = {}
        self.generations: dict[int, list[Generation]] = defaultdict(list)
        self.last_prompt: dict[str, list[int]] = {}

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, **kwargs) -> TokenOutput:
        if request_id not in self.sample_of:
            self.sample_of[request_id] = int(MARKER.search(self.tokenizer.decode(prompt_ids)).group(1))
        sample = self.sample_of[request_id]
        images = list(image_data or [])
        text = self.script(sample, len(self.generations[sample]), images)
        stop_reason = "completed"
        if text.startswith(ABORTED):  # what verl's vLLM server returns for a request vLLM aborted mid-generation
            text, stop_reason = text[len(ABORTED) :], "aborted"
        token_ids = self.tokenizer.encode(text, add_special_tokens=False)[: sampling_params.get("max_tokens")]
        log_probs = [server_logprob(i) for i in range(len(token_ids))]
        previous = self.last_prompt.get(request_id)
        self.last_prompt[request_id] = list(prompt_ids)
        cached = prefix_cache_hits(prompt_ids, [previous] if previous else [])  # the trajectory's previous prompt
        self.generations[sample].append(Generation(token_ids, log_probs, images, len(prompt_ids), cached))
        await asyncio.sleep(0)
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            num_preempted=0,
            stop_reason=stop_reason,
            extra_fields={"num_cached_tokens": cached},
        )


def marked_prompt(index: int, text: str, images: Sequence[Image.Image] = ()) -> list[dict]:
    content = [{"type": "image", "image": image} for image in images]
    return [{"role": "user", "content": content + [{"type": "text", "text": f"[sample {index}] {text}"}]}]


# ----- batches ----------------------------------------------------------------------------------------------------


@dataclass
class Batch:
    output: Any  # DataProto
    server: RecordingServer
    worker: Any

    def field(self, key: str) -> list:
        return list(self.output.non_tensor_batch[key])


def run_batch(model_dir, workdir, *, tools, prompts, script, columns=None, loop_options=None, **config_kwargs) -> Batch:
    """One batch through verl's AgentLoopWorker.generate_sequences with a RecordingServer."""
    with restored_loop_registry():  # the worker registers the YAML's loop options process-wide
        worker = make_worker(
            LocalRollout(model_dir, None, workdir).config(loop_options=loop_options, **config_kwargs), None
        )
        worker.tools = list(tools)
        server = RecordingServer(worker.tokenizer, script)
        worker.llm_client = server
        return Batch(generate(worker, make_batch(prompts, **(columns or {}))), server, worker)


def make_loop(model_dir, workdir, *, tools, loop_options=None, **config_kwargs):
    """A real mm_tool loop instance, built as verl's worker builds one for each trajectory (for tool-layer tests
    that call the loop's tool execution directly, thousands of times)."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry

    with restored_loop_registry():
        worker = make_worker(
            LocalRollout(model_dir, None, workdir).config(loop_options=loop_options, **config_kwargs), None
        )
        return hydra.utils.instantiate(
            config=_agent_loop_registry["mm_tool"],
            trainer_config=DictConfigWrap(config=worker.config),
            server_manager=None,
            tokenizer=worker.tokenizer,
            processor=worker.processor,
            hf_model_type=worker.hf_model_type,
            dataset_cls=worker.dataset_cls,
            data_config=DictConfigWrap(worker.config.data),
            tools=ToolListWrap(list(tools)),
        )


# ----- invariants -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float] | None
    grid: list[list[int]]


def row_of(output, index: int) -> Row:
    """One sample without padding, from the batch tensors and verl's multi_modal_inputs."""
    width = output.batch["prompts"].shape[1]
    attention = output.batch["attention_mask"][index].bool()
    response_attended = attention[width:]
    logprobs = None
    if "rollout_log_probs" in output.batch.keys():
        logprobs = output.batch["rollout_log_probs"][index][response_attended].tolist()
    inputs = output.non_tensor_batch["multi_modal_inputs"][index]
    grid = inputs["image_grid_thw"].tolist() if "image_grid_thw" in inputs else []
    return Row(
        prompt_ids=output.batch["prompts"][index][attention[:width]].tolist(),
        response_ids=output.batch["responses"][index][response_attended].tolist(),
        response_mask=output.batch["response_mask"][index][response_attended].tolist(),
        logprobs=logprobs,
        grid=grid,
    )


def runs_of(token_ids: list[int], token: int) -> list[int]:
    runs, previous = [], None
    for current in token_ids:
        if current == token:
            if previous == token:
                runs[-1] += 1
            else:
                runs.append(1)
        previous = current
    return runs


def grid_tokens(grid: list[list[int]]) -> list[int]:
    return [int(np.prod(thw)) // MERGE**2 for thw in grid]


def trajectory_violations(batch: Batch, index: int, sample: int | None = None) -> list[str]:
    """Every broken invariant of one output row (empty when sound): lengths, padding, the generated tokens and
    log-probs are exactly the server's, image placeholder runs equal the processor features per image, the loop's
    counters agree with the batch."""
    output, sample = batch.output, index if sample is None else sample
    row = row_of(output, index)
    image_pad = batch.worker.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    problems = []
    padded_mask = output.batch["response_mask"][index]
    width = output.batch["prompts"].shape[1]
    if bool((padded_mask.bool() & ~output.batch["attention_mask"][index][width:].bool()).any()):
        problems.append("response_mask is set on padding")
    if row.logprobs is not None and len(row.logprobs) != len(row.response_ids):
        problems.append(f"{len(row.logprobs)} log-probs for {len(row.response_ids)} response tokens")
    if len(row.response_mask) != len(row.response_ids):
        problems.append(f"{len(row.response_mask)} mask entries for {len(row.response_ids)} response tokens")
    runs, tokens = runs_of(row.prompt_ids + row.response_ids, image_pad), grid_tokens(row.grid)
    if runs != tokens:
        problems.append(f"placeholder runs {runs} != processor tokens per image {tokens}")
    masked = output.non_tensor_batch["mm_tool/masked"][index]
    if masked:
        if any(row.response_mask):
            problems.append("a masked trajectory trains on some tokens")
        return problems
    problems += _generation_problems(row, batch.server.generations.get(sample, []))
    if output.non_tensor_batch["mm_tool/images"][index] != len(row.grid):
        problems.append(f"mm_tool/images={output.non_tensor_batch['mm_tool/images'][index]}, grid has {len(row.grid)}")
    if output.non_tensor_batch["mm_tool/image_tokens"][index] != sum(tokens):
        problems.append(
            f"mm_tool/image_tokens={output.non_tensor_batch['mm_tool/image_tokens'][index]} != {sum(tokens)}"
        )
    return problems


def _generation_problems(row: Row, generations: list[Generation]) -> list[str]:
    generated = [token for token, mask in zip(row.response_ids, row.response_mask) if mask]
    served = [token for generation in generations for token in generation.token_ids]
    if generated != served:
        return [f"trained tokens differ from the server's ({len(generated)} vs {len(served)} tokens)"]
    if row.logprobs is None:
        return []
    logprobs = [value for value, mask in zip(row.logprobs, row.response_mask) if mask]
    served_logprobs = [value for generation in generations for value in generation.log_probs]
    if not np.allclose(logprobs, served_logprobs, atol=1e-6):
        return ["rollout log-probs of generated tokens differ from the server's"]
    if any(value != 0.0 for value, mask in zip(row.logprobs, row.response_mask) if not mask):
        return ["context tokens carry non-zero rollout log-probs"]
    return []


def tool_image_pixels(row: Row, prompt_images: int) -> list[int]:
    """Pixels of each tool or environment image as the processor saw it (from its grid)."""
    return [h * w * PATCH * PATCH for _, h, w in row.grid[prompt_images:]]
