"""One-call rollouts of the mm_tool loop (or any registered loop) through verl's real ``AgentLoopWorker``, in one
process, answered by a ``ScriptedServer``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from verl_mm_tools.plugin import LOOP_NAME, LOOP_TARGET
from verl_mm_tools.runtime.batch import make_batch
from verl_mm_tools.runtime.config import compose_trainer_config
from verl_mm_tools.runtime.workers import (
    InProcessActor,
    generate,
    in_process_reward_worker,
    make_worker,
    restored_loop_registry,
)
from verl_mm_tools.testkit.scripted import Script, ScriptedServer
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.tools.base_tool import BaseTool
    from verl.tools.function_tool import FunctionTool

    from verl_mm_tools.cpu.hf_engine import HFVisionLM


class LocalRollout:
    """One-call rollouts of the mm_tool loop (or any registered loop) through verl's real AgentLoopWorker, with a
    scripted or model-backed server: ``LocalRollout(model_dir, tools_yaml, workdir).run(turns, prompts)``."""

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
        model: HFVisionLM | None = None,
        columns: dict | None = None,
        tools: Iterable[BaseTool | FunctionTool] | None = None,
        score: bool = False,
        per_sample: bool = False,
        server: Callable[[PreTrainedTokenizerBase], ScriptedServer] | None = None,
        client: Callable[[DictConfig, ScriptedServer], object] | None = None,
        **config_kwargs: Any,
    ) -> tuple[DataProto, ScriptedServer, AgentLoopWorker]:
        """Returns (the generated DataProto, the server with its recorded requests, the worker). ``tools`` replaces
        the tools loaded from the YAML (instances, e.g. defined in a test); ``score`` streams every trajectory
        through verl's real reward worker (the configured reward manager), in-process; ``per_sample`` takes loops
        that return several training samples per trajectory, one row each (``per_sample_worker_class``);
        ``server(tokenizer)`` builds the server instead of a ScriptedServer of ``turns``; ``client(config, server)``
        puts a client of verl's between the worker and the server (e.g. ``resume.resuming_client``)."""
        with restored_loop_registry():
            worker = make_worker(self.config(**config_kwargs), None, per_sample=per_sample)
            if tools is not None:
                worker.tools = list(tools)
            if score:
                worker.reward_loop_worker_handles = [InProcessActor(in_process_reward_worker(worker.config))]
            backend = server(worker.tokenizer) if server else ScriptedServer(worker.tokenizer, turns, model=model)
            worker.llm_client = client(worker.config, backend) if client else backend
            return generate(worker, make_batch(prompts, **(columns or {}))), backend, worker


def rotate_rollout(model_dir: str | os.PathLike, workdir: str | os.PathLike) -> LocalRollout:
    """A ``LocalRollout`` of the mm_tool loop with the rotate tool (its YAML written into ``workdir``)."""
    tools_yaml = Path(workdir) / "tools.yaml"
    tools_yaml.write_text(ROTATE_TOOLS_YAML)
    return LocalRollout(model_dir, tools_yaml, workdir)
