"""Rollouts of the mm_tool loop (or any registered loop) through verl's real ``AgentLoopWorker``, in one process,
answered by a ``ScriptedClient`` (or a server of the caller's): one batch through the worker (``LocalRollout``), or
one batch per step through verl-mm-tools' agent-loop manager, scored by verl's reward worker (``run_steps``)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from verl_mm_tools.plugin import LOOP_NAME, LOOP_TARGET
from verl_mm_tools.runtime.batch import make_batch
from verl_mm_tools.runtime.config import CLASSIC_HOOK, compose_trainer_config
from verl_mm_tools.runtime.scripted_client import Script, ScriptedClient
from verl_mm_tools.runtime.workers import (
    InProcessActor,
    generate,
    in_process_manager,
    in_process_reward_worker,
    make_worker,
    restored_loop_registry,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.tools.base_tool import BaseTool
    from verl.tools.function_tool import FunctionTool

    # the scripted client's turns, from the worker's tokenizer
    TurnsFor = Callable[[PreTrainedTokenizerBase], Sequence[str | None] | Script]

# What ``run_steps`` scores with: verl-mm-tools' per-turn discount manager over the rotation reward (an ``extra``
# override replaces a part, e.g. ``reward.reward_kwargs.reward_fn``)
REWARD_OVERRIDES = (
    "reward.reward_manager.name=mm_turn_discount",
    "+reward.reward_kwargs.gamma=0.9",
    "+reward.reward_kwargs.reward_fn=rotation_reward_45",
)


class LocalRollout:
    """One-call rollouts of the mm_tool loop (or any registered loop) through verl's real AgentLoopWorker, with a
    scripted client or a server of the caller's: ``LocalRollout(model_dir, tools_yaml, workdir).run(turns,
    prompts)``."""

    def __init__(self, model_dir: str | os.PathLike, tools_yaml: str | os.PathLike | None, workdir: str | os.PathLike):
        self.model_dir = str(model_dir)
        self.tools_yaml = tools_yaml
        self.workdir = Path(workdir)

    def config(
        self,
        *,
        prompt_length: int = 1024,
        response_length: int = 512,
        max_turns: int = 4,
        loop_options: dict | None = None,
        extra: Sequence[str] = (),
    ) -> DictConfig:
        overrides = [
            "actor_rollout_ref.rollout.name=vllm",  # any name: the worker talks to the server we hand it
            f"actor_rollout_ref.rollout.prompt_length={prompt_length}",
            f"actor_rollout_ref.rollout.response_length={response_length}",
            f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={max_turns}",
        ]
        if self.tools_yaml is not None:
            overrides.append(f"actor_rollout_ref.rollout.multi_turn.tool_config_path={self.tools_yaml}")
        if loop_options is not None:
            entry = {"name": LOOP_NAME, "_target_": LOOP_TARGET, **loop_options}
            loops_yaml = self.workdir / "agent_loops.yaml"
            loops_yaml.write_text(json.dumps([entry]))
            overrides.append(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops_yaml}")
        return compose_trainer_config(self.model_dir, [*overrides, *extra])

    def run(
        self,
        turns: Sequence[str | None] | Script,
        prompts: Sequence[list[dict]],
        *,
        columns: dict | None = None,
        tools: Iterable[BaseTool | FunctionTool] | None = None,
        score: bool = False,
        per_sample: bool = False,
        server: Callable[[PreTrainedTokenizerBase], ScriptedClient] | None = None,
        client: Callable[[DictConfig, ScriptedClient], object] | None = None,
        **config_kwargs: Any,
    ) -> tuple[DataProto, ScriptedClient, AgentLoopWorker]:
        """Returns (the generated DataProto, the server with its recorded requests, the worker). ``tools`` replaces
        the tools loaded from the YAML (instances, e.g. defined in a test); ``score`` streams every trajectory
        through verl's real reward worker (the configured reward manager), in-process; ``per_sample`` takes loops
        that return several training samples per trajectory, one row each (``per_sample_worker_class``);
        ``server(tokenizer)`` builds the server instead of a ScriptedClient of ``turns`` (e.g. the test kit's
        ``ScriptedServer`` with a model); ``client(config, server)`` puts a client of verl's between the worker and
        the server (e.g. the test kit's ``resume.resuming_client``)."""
        with restored_loop_registry():
            worker = make_worker(self.config(**config_kwargs), None, per_sample=per_sample)
            if tools is not None:
                worker.tools = list(tools)
            if score:
                worker.reward_loop_worker_handles = [InProcessActor(in_process_reward_worker(worker.config))]
            backend = server(worker.tokenizer) if server else ScriptedClient(worker.tokenizer, turns)
            worker.llm_client = client(worker.config, backend) if client else backend
            return generate(worker, make_batch(prompts, **(columns or {}))), backend, worker


def run_steps(
    rollout: LocalRollout,
    turns_for: TurnsFor,
    prompts: Sequence[list[dict]],
    columns: dict,
    *,
    steps: Sequence[int],
    loop_options: dict,
    extra: Sequence[str] = (),
    validate: bool = False,
) -> tuple[list[DataProto], ScriptedClient]:
    """Generate one batch per step through MMToolAgentLoopManager (scored in-process, ``REWARD_OVERRIDES`` then
    ``extra``); returns the outputs and the client (its ``requests`` hold the images the model saw).
    ``turns_for(tokenizer)`` gives the ScriptedClient's turns (a list of texts or a script function)."""
    config = rollout.config(loop_options=loop_options, extra=[*CLASSIC_HOOK, *REWARD_OVERRIDES, *extra])
    with restored_loop_registry():
        return _run_manager_steps(config, turns_for, prompts, columns, steps, validate)


def _run_manager_steps(
    config: DictConfig,
    turns_for: TurnsFor,
    prompts: Sequence[list[dict]],
    columns: dict,
    steps: Sequence[int],
    validate: bool,
) -> tuple[list[DataProto], ScriptedClient]:
    manager, worker = in_process_manager(config)
    server = ScriptedClient(worker.tokenizer, turns_for(worker.tokenizer))
    worker.llm_client = server
    outputs = []
    for step in steps:
        batch = make_batch(prompts, **columns)
        batch.meta_info.update(global_steps=step, validate=validate)
        outputs.append(generate(manager, batch))
    return outputs, server
