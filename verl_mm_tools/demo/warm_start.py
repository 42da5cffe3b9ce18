"""A supervised warm start that teaches a random tiny model the OUTPUT FORMAT of a demo task, not its answers.

A random-weight model never writes a parseable tool call, so RL has nothing to reinforce. Before training, we run
demonstrations through the real mm_tool loop (verl's ``AgentLoopWorker`` with a scripted server, so the tokens are
exactly those a rollout produces): turn 1 calls a tool (``rotate`` with a random angle; ``zoom_in`` on the centre
box), the tool answers with an image, turn 2 answers ``<answer>A</answer>`` with a RANDOM answer A among the task's
choices (``TASKS``; the color task answers in turn 1, the zoom tasks in turn 1 in half their demonstrations). The
labels are uninformative by construction (``uninformative_labels``, drawn apart for the demonstrations that call and
those that do not): fitting them teaches the format and leaves the answer at chance. After a call, a task may fit
another answer instead (``AfterCall``): learn_zoom fits either answer, balanced over each batch (a random label there
taught it to ignore the zoomed image); the main job's ``zoom`` task fits the true answer, a cold start that reads the
zoomed image but calls no more often than it answers at once. The loss is summed over tokens (every labelled token
weighs the same, whatever its sample's length, unless its task weighs it): averaging per sample first made the short
tool-call turn count too little.

The result is cached under the tiny-model cache, keyed by everything that determines it. The parts: the tasks'
formats (``format_tasks``), the demonstrations (``demonstrations``) and the fit (``fit``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from verl_mm_tools.demo.demonstrations import demonstrations
from verl_mm_tools.demo.fit import answer_shares, fit, one_thread, read_after_calls
from verl_mm_tools.demo.fit_check import cold_start_check
from verl_mm_tools.demo.format_tasks import TASKS, AfterCall, WarmStartSpec
from verl_mm_tools.errors import ColdStartError

logger = logging.getLogger(__name__)

WARM_START_VERSION = 5
MARKER = "warm_start.json"
DEFAULT_SPEC = WarmStartSpec()


def warm_started_model(
    base_dir: str | Path,
    tools_yaml: str | Path,
    spec: WarmStartSpec = DEFAULT_SPEC,
    cache_root: str | Path | None = None,
) -> Path:
    """The warm-started copy of ``base_dir`` for the tools in ``tools_yaml`` (built once, then reused)."""
    from verl_mm_tools.remote.tool import without_remote

    base_dir = Path(base_dir)
    tools_text = without_remote(Path(tools_yaml).read_text())  # demonstrations run the tools here, not on Ray
    key = cache_key(base_dir, tools_text, spec)

    def build(scratch: Path) -> tuple[Path, dict]:
        model, local_tools = scratch / "model", scratch / "tools.yaml"
        shutil.copytree(base_dir, model)
        local_tools.write_text(tools_text)
        return model, warm_start(model, local_tools, spec)

    return cached_model(base_dir, "warm", key, MARKER, build, cache_root)


def cache_key(base_dir: Path, tools_text: str, spec: WarmStartSpec) -> dict:
    """Everything that determines a warm start: its version, the base model, the tools, the spec and the task."""
    task = TASKS[spec.task]
    return {
        "version": WARM_START_VERSION,
        "base": base_dir.name,
        "tools": tools_text,
        **asdict(spec),
        "question": task.question,
        "answers": task.answers,
        "calls": task.calls,
        "direct_share": task.direct_share,
        "sight": task.sight,
        "after_call": task.after_call.value,
        "after_call_weight": task.after_call_weight,
        "reading_steps": task.reading_steps,
    }


def cached_model(
    base_dir: Path,
    kind: str,
    key: dict,
    marker: str,
    build: Callable[[Path], tuple[Path, dict]],
    cache_root: str | Path | None = None,
) -> Path:
    """``<cache_root>/<base name>-<kind>-<digest of key>``, built once by ``build(scratch)`` (the model folder it
    made inside ``scratch`` and a report, written with ``key`` to ``marker``), then reused."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    target = Path(cache_root or base_dir.parent) / f"{base_dir.name}-{kind}-{digest}"
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{target.name}-", dir=target.parent) as scratch:
        model, report = build(Path(scratch))
        (model / marker).write_text(json.dumps({**key, **report}, indent=1))
        if not target.exists():
            model.rename(target)  # atomic: a concurrent builder of the same key wins or loses whole
    return target


def warm_start(model_dir: Path, tools_yaml: Path, spec: WarmStartSpec) -> dict:
    """Fit the model in ``model_dir`` to demonstrations, in place; returns timing and loss figures."""
    from transformers import AutoModelForImageTextToText

    started = time.perf_counter()
    examples = demonstrations(model_dir, tools_yaml, spec)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    task = TASKS[spec.task]
    with one_thread():
        reading = read_after_calls(model, examples, spec)
        losses = fit(model, examples, spec)
        own = [example for example in examples if not example["sight"]]
        shares = answer_shares(model, own, model_dir, task.answers)
        check = cold_start_check(model, examples, reads=task.after_call == AfterCall.TRUE)
    report = {
        "seconds": round(time.perf_counter() - started, 2),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "reading_losses": reading[:1] + reading[-1:],
        "answer_shares": shares,
        "check": asdict(check),
    }
    logger.info("warm start: %s", report)
    failures = check.failures(task.direct_share)
    if task.checked and failures:
        raise ColdStartError(
            f"the warm start of {spec.task} (seed {spec.seed}, {spec.steps} steps at lr {spec.lr}) did not take: "
            f"{'; '.join(failures)} (last loss {losses[-1]}); RL would have nothing to reinforce. Try another "
            "--seed; nothing was cached"
        )
    model.save_pretrained(model_dir)
    return report
