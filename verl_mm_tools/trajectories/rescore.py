"""Recorded trajectories scored again (``verl-mm-tools rescore``) with another reward function or reward manager,
through verl's own reward worker (``RewardLoopWorker``, which builds the configured manager class exactly as a
training run does), with no policy model and no inference server: only the model's tokenizer and processor.

A manager gets what verl's ``AgentLoopWorker._compute_score`` hands the reward worker in training (the streaming
reward path, the one training and ``verl-mm-tools eval`` score on), rebuilt from the record, which keeps text and
token counts but no token ids (``manager_input``):

- one row, the trajectory's final training sample (the only one unless the loop's ``export`` was per_turn or auto,
  and the one verl's v1 manager scores: ``adaptations.manager_tq``): ``prompts`` and ``responses`` re-tokenised
  from the record's ``chat`` (the conversation as the chat template rendered it in the loop) by the model's chat
  template and processor, image placeholders expanded from the record's PNGs (the pixels the model saw). Every
  sample is rebuilt, to check its counts against the record's: its prompt is the render of the conversation before
  its first turn, with the generation prompt; its response the rest of the render up to its last turn, cut to the
  recorded response length (the loop's response ends at the generated end-of-turn token, before the newline the
  template writes after it, and is cut at ``response_length``). A masked trajectory's response is one eos token, as
  the loop's stand-in output. Where the rebuilt counts differ from the record's (a template that rewrites history,
  a masked trajectory whose prompt never rendered), the row says ``tokens_as_recorded: false``;
- ``attention_mask`` ones, ``input_ids`` prompt + response, ``position_ids`` 0..n-1 (plain: M-RoPE ids need the
  model's vision config and pixel inputs; no manager of verl's or ours reads them);
- the dataset row's columns ``data_source``, ``reward_model.ground_truth``, ``extra_info``, ``index``, ``uid`` from
  the record's ``sample`` (with ``--reward-fn``, ``extra_info.reward_fn`` is replaced: a row naming its own function
  would otherwise keep it under ``mm_turn_discount``). Not recorded, not rebuilt: ``raw_prompt``, ``tools_kwargs``
  and ``reward_model.style`` (only a reward model reads the raw prompt, and rescore runs none);
- ``tool_extra_fields``: the loop's extra fields from the record's ``stats`` (``mm_tool/`` prefix restored;
  ``attempts``, ``tool_call_counts``, ``turn_scores``, ``tool_rewards``, per-turn ``mm_tool/turn_rewards``), plus
  ``last_assistant_text`` (not in ``stats``): the last assistant message re-tokenised and decoded without special
  tokens, as the loop decodes it (verl's own extra fields, the server's weight versions, are not recorded);
- ``__num_turns__``: assistant turns + tool and environment turns + 1, as verl counts them (1 for a masked one).

Output (``OUT``): ``report.json``, ``report.txt`` and ``rows.jsonl`` in ``verl-mm-tools eval``'s format (its own
``evaluate.report`` functions), each group of records (an eval output's mode; everything else together) as two
modes side by side, the scores as recorded (``before``) and rescored; and ``trajectories/<step>/<id>/``, copies of
the records whose ``reward`` is the new one, the recorded one kept under ``reward_before``, with ``rescored``
saying how (``verl-mm-tools view OUT/trajectories`` shows both).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from verl_mm_tools.agent_loop.harness import object_array
from verl_mm_tools.errors import ConfigError, did_you_mean
from verl_mm_tools.record import RECORD_FILE, STATS_KEYS, RecordError, chat_image_ids, jsonable
from verl_mm_tools.trajectories.read import BadRecord, LoadedRecord, RecordSet, load_records
from verl_mm_tools.trajectories.rescore_command import DEFAULT_MANAGER

logger = logging.getLogger(__name__)

TRAJECTORIES = "trajectories"
REPORT_FILE, REPORT_TEXT, ROWS_FILE = "report.json", "report.txt", "rows.jsonl"
SETTINGS_FILE = "rescore.json"  # written first: marks the folder as a rescore output (even one cut short)
EVAL_ROWS_FILE = "rows.jsonl"  # what marks OUT/<mode>/ of a verl-mm-tools eval output (evaluate.run writes it)
BEFORE, RESCORED = "before", "rescored"
REWARDS_MODULE = "pkg://verl_mm_tools.rewards"  # where verl's custom_reward_function finds our functions by name


@dataclass(frozen=True)
class RescoreOptions:
    records: tuple[Path, ...]  # dump folders, eval output folders or trajectory.json files
    out: Path
    reward_fn: str | None = None  # a built-in reward function (REWARD_FUNCTIONS)
    reward_manager: str = DEFAULT_MANAGER  # a name in verl's reward-manager registry
    model_path: str | None = None  # the tokenizer and processor (default: each record's ``model``)
    overrides: tuple[str, ...] = ()  # hydra overrides of verl's trainer config (reward settings), last

    def describe(self) -> dict:
        return {
            "reward_fn": self.reward_fn,
            "reward_manager": self.reward_manager,
            "overrides": list(self.overrides),
            "model_path": self.model_path,
        }


@dataclass
class Rescored:
    """One record scored again: its new score and reward extra info, and whether its tokens were rebuilt as
    recorded."""

    item: LoadedRecord
    score: float
    extra: dict
    tokens_as_recorded: bool
    fields: dict  # the loop's extra fields as rebuilt (the report's columns)
    mode: str | None = None  # the eval mode of its output folder; None outside an eval output
    copy: Path | None = None  # its copy under OUT/trajectories


@dataclass
class ManagerInput:
    data: Any  # verl's DataProto, one row per training sample
    fields: dict
    tokens_as_recorded: bool


def rescore(options: RescoreOptions) -> dict:
    """Score the records under ``options.records`` again and write ``options.out``; returns the report
    (``{"records", "rescore", "modes", "table", "bad_records"}``). A ConfigError when no record could be scored."""
    check_choices(options)
    loaded = usable_records(options.records)
    prepare_out(options, loaded.records)
    scored = []
    for model_path, items in _by_model(loaded, options.model_path).items():
        scored += _score_with_model(model_path, items, loaded, options)
    if not scored:
        reasons = "; ".join(described(bad) for bad in loaded.bad) or "no record found"
        raise ConfigError(f"no record could be rescored: {reasons}")
    for bad in loaded.bad:
        logger.warning("rescore: left out %s", described(bad))
    return write_outputs(scored, loaded, options)


def described(bad: BadRecord) -> str:
    """A bad record's file and reason (the reader's reasons already start with the file)."""
    return bad.reason if bad.reason.startswith(str(bad.path)) else f"{bad.path}: {bad.reason}"


# ----- choices and records ---------------------------------------------------------------------------------------


def check_choices(options: RescoreOptions) -> None:
    """The manager and the function exist (before any model is loaded)."""
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

    import verl_mm_tools.plugin  # noqa: F401  registers our managers into verl's registry
    from verl_mm_tools.rewards.registry import get_reward_function

    if options.reward_manager not in REWARD_MANAGER:
        choices = sorted(REWARD_MANAGER)
        raise ConfigError(
            f"--reward-manager {options.reward_manager!r} is not in verl's reward-manager registry; registered: "
            f"{choices}." + did_you_mean(options.reward_manager, choices)
        )
    if options.reward_fn is not None:
        get_reward_function(options.reward_fn)  # a ConfigError naming the built-in functions


def usable_records(paths: Sequence[Path]) -> RecordSet:
    """The readable records (``read.load_records``), each once, whose image files are all there (the copies must
    show in the viewer and the processor needs the pixels); the others moved to ``bad`` with the reason."""
    loaded = load_records(list(paths))
    seen_paths: set[Path] = set()
    seen_ids: dict[str, Path] = {}
    for item in list(loaded.records):
        resolved = item.path.resolve()
        if resolved in seen_paths:  # the same file reached through two of the given paths
            loaded.records.remove(item)
            continue
        seen_paths.add(resolved)
        record_id = str(item.record.get("id"))
        if record_id in seen_ids:
            loaded.refuse(item, f"the same trajectory (id {record_id}) as {seen_ids[record_id]}: rescored once")
            continue
        seen_ids[record_id] = item.path
        try:
            _check_image_files(item)
        except RecordError as error:
            loaded.refuse(item, str(error))
    return loaded


def _check_image_files(item: LoadedRecord) -> None:
    for entry in item.record.get("images") or []:
        if entry.get("file"):
            item.image_file(entry["id"])  # a RecordError naming the missing file


def prepare_out(options: RescoreOptions, records: list[LoadedRecord]) -> None:
    """An empty ``out`` (a previous rescore output there is replaced), never one holding the records read; its
    settings file first."""
    out = options.out
    resolved = out.resolve()
    for item in records:
        if resolved in item.path.resolve().parents:
            raise ConfigError(f"--out {out} holds the record {item.path} being rescored; write to another folder")
    if out.exists() and any(out.iterdir()):
        if not (out / SETTINGS_FILE).is_file():
            raise ConfigError(f"--out {out} is not empty and not a rescore output; pass an empty or new folder")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / SETTINGS_FILE).write_text(json.dumps(options.describe(), indent=2) + "\n")


def _by_model(loaded: RecordSet, model_path: str | None) -> dict[str, list[LoadedRecord]]:
    groups: dict[str, list[LoadedRecord]] = {}
    for item in list(loaded.records):
        path = model_path or item.record.get("model")
        if not path:
            loaded.refuse(item, "the record names no model (its 'model' is empty): pass --model-path")
            continue
        groups.setdefault(str(path), []).append(item)
    return groups


# ----- scoring through verl's reward worker ----------------------------------------------------------------------


def _score_with_model(
    model_path: str, items: list[LoadedRecord], loaded: RecordSet, options: RescoreOptions
) -> list[Rescored]:
    try:  # a model that does not load costs its records, not the others (a bad setting raises a ConfigError)
        worker = reward_worker(model_path, options)
        renderer = ChatRenderer.load(model_path, worker.config)
    except OSError as error:
        for item in items:
            loaded.refuse(item, f"cannot load the tokenizer and processor of {model_path} ({error}): pass --model-path")
        return []
    inputs = []
    for item in items:
        try:
            inputs.append((item, manager_input(item, renderer, options.reward_fn)))
        except RecordError as error:
            loaded.refuse(item, str(error))
    results = _compute_scores(worker, [prepared.data for _, prepared in inputs])
    scored = []
    for (item, prepared), result in zip(inputs, results, strict=True):
        if isinstance(result, BaseException):
            failure = f"{type(result).__name__}: {result}"
            loaded.refuse(item, f"reward manager {options.reward_manager!r} failed on it: {failure}")
            continue
        extra = _plain(result.get("reward_extra_info") or {})
        scored.append(
            Rescored(item, float(_plain(result["reward_score"])), extra, prepared.tokens_as_recorded, prepared.fields)
        )
    return scored


def reward_worker(model_path: str, options: RescoreOptions):
    """verl's ``RewardLoopWorker`` on verl's trainer config with the chosen manager and function, in-process."""
    from verl_mm_tools.agent_loop.harness import compose_trainer_config, in_process_reward_worker
    from verl_mm_tools.rewards.managers import REWARD_MANAGERS

    overrides = [f"reward.reward_manager.name={options.reward_manager}"]
    if options.reward_fn is not None and options.reward_manager in REWARD_MANAGERS:
        overrides.append(f"+reward.reward_kwargs.reward_fn={options.reward_fn}")  # how our managers name it
    elif options.reward_fn is not None:  # verl's managers score with reward.custom_reward_function
        overrides += [
            f"reward.custom_reward_function.path={REWARDS_MODULE}",
            f"reward.custom_reward_function.name={options.reward_fn}",
        ]
    config = compose_trainer_config(model_path, [*overrides, *options.overrides])
    if config.reward.reward_model.enable:
        raise ConfigError(
            "reward.reward_model.enable=true: rescore runs no reward-model server; score with a reward function"
        )
    return in_process_reward_worker(config)


def _compute_scores(worker, batches: list) -> list:
    """``worker.compute_score`` on every batch at once, on verl's event loop (the one the worker's manager
    captured); a ConfigError stops everything (every record would fail the same way), other errors are per record."""
    from verl.utils.ray_utils import get_event_loop

    async def run():
        return await asyncio.gather(*(worker.compute_score(batch) for batch in batches), return_exceptions=True)

    results = get_event_loop().run_until_complete(run())
    for result in results:
        if isinstance(result, ConfigError):
            raise result
    return results


def _plain(value: Any) -> Any:
    """Tensors (verl's DAPO manager adds one to the score) as Python numbers, then plain JSON types."""
    if hasattr(value, "tolist") and not isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return jsonable(value)


# ----- the manager's input, rebuilt from a record ----------------------------------------------------------------


class ChatRenderer:
    """The model's chat template and processor: a conversation of the record's ``chat`` to token ids, images
    expanded as the loop's processor call expanded them."""

    def __init__(self, tokenizer, processor, mm_processor_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.processor = processor
        self.mm_processor_kwargs = mm_processor_kwargs or {}

    @classmethod
    def load(cls, model_path: str, config) -> ChatRenderer:
        """The model's tokenizer and processor as verl's agent-loop worker loads them, with the processor kwargs of
        verl's config (``data.mm_processor_kwargs``)."""
        from omegaconf import OmegaConf
        from verl.utils import hf_processor, hf_tokenizer

        mm_processor_kwargs = OmegaConf.to_container(config.data.mm_processor_kwargs, resolve=True)
        return cls(hf_tokenizer(model_path), hf_processor(model_path), mm_processor_kwargs)

    def token_ids(self, messages: list[dict], images: list, chat: dict, add_generation_prompt: bool) -> list[int]:
        from verl.utils.tokenizer.chat_template import apply_chat_template
        from verl.utils.tokenizer.tokenizer import build_multimodal_processor_inputs, normalize_token_ids

        text = apply_chat_template(
            self.processor or self.tokenizer,
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            tools=chat.get("tools"),
            **(chat.get("template_kwargs") or {}),
        )
        if self.processor is None:
            return self.tokenizer.encode(text, add_special_tokens=False)
        inputs = build_multimodal_processor_inputs(
            self.processor, text=[text], images=images or None, mm_processor_kwargs=self.mm_processor_kwargs or None
        )
        return normalize_token_ids(inputs["input_ids"])

    def plain_text(self, text: str) -> str:
        """``text`` (decoded with special tokens) as the loop decodes generated tokens for the reward managers:
        re-tokenised, decoded without special tokens."""
        return self.tokenizer.decode(self.tokenizer.encode(text, add_special_tokens=False), skip_special_tokens=True)


def manager_input(item: LoadedRecord, renderer: ChatRenderer, reward_fn: str | None) -> ManagerInput:
    """What verl's ``AgentLoopWorker._compute_score`` hands the reward worker for this trajectory (module doc)."""
    record = item.record
    chat = record.get("chat")
    if not chat:
        raise RecordError(
            f"{item.path}: record version {record.get('version')} has no rendered conversation ('chat', records of "
            "version 4 on): its response tokens cannot be rebuilt for the reward manager; re-record it"
        )
    messages = template_messages(record, chat)
    images = _images(item)
    if images and renderer.processor is None:
        raise RecordError(
            f"{item.path}: its images need the model's processor to rebuild their placeholder tokens, and "
            f"{record.get('model')} has none that loads: pass --model-path of the model that generated it"
        )
    samples, as_recorded = [], True
    for sample in record.get("samples") or []:
        prompt, response, matches = sample_tokens(record, sample, messages, images, chat, renderer)
        samples.append((prompt, response))
        as_recorded = as_recorded and matches
    if not samples:
        raise RecordError(f"{item.path}: the record lists no training sample ('samples'): nothing to score")
    fields = loop_fields(item, renderer)
    data = _data_proto(*samples[-1], row_columns(record, reward_fn), fields, num_turns(record))
    return ManagerInput(data, fields, as_recorded)


def template_messages(record: dict, chat: dict) -> list[dict]:
    """The record's rendered conversation as the chat template takes it (image parts as ``{"type": "image"}``, the
    pixels passed to the processor in order), plus the turns cut by a length or turn limit, which never became a
    message (the record keeps their text with its messages)."""
    messages = [_template_message(message) for message in chat["messages"]]
    in_chat = sum(message["role"] == "assistant" for message in messages)
    assistants = [message for message in record.get("messages") or [] if message.get("role") == "assistant"]
    messages += [{"role": "assistant", "content": message["text"]} for message in assistants[in_chat:]]
    return messages


def _template_message(message: dict) -> dict:
    content = message.get("content")
    if isinstance(content, list):
        content = [{"type": "image"} if part.get("type") == "image" else part for part in content]
    return {**message, "content": content}


def _images(item: LoadedRecord) -> list:
    """The pixels of the record's images in the rendered conversation's order (the ids in ``chat``)."""
    images = []
    for image_id in chat_image_ids(item.record["chat"]):
        with Image.open(item.image_file(image_id)) as image:
            images.append(image.copy())
    return images


def sample_tokens(
    record: dict, sample: dict, messages: list[dict], images: list, chat: dict, renderer: ChatRenderer
) -> tuple[list[int], list[int], bool]:
    """One training sample's prompt and response ids, and whether their counts are the record's."""
    assistant_at = [index for index, message in enumerate(messages) if message["role"] == "assistant"]
    turns = sample.get("turns") or []
    start = assistant_at[turns[0] - 1] if turns else (assistant_at[0] if assistant_at else len(messages))
    prompt = renderer.token_ids(messages[:start], _images_in(messages[:start], images), chat, True)
    if not turns:  # the loop's stand-in for a masked trajectory: its prompt and one eos token
        response = [renderer.tokenizer.eos_token_id]
        return prompt, response, len(prompt) == sample["prompt_tokens"] and sample["response_tokens"] == 1
    if turns[-1] > len(assistant_at):
        raise RecordError(
            f"sample {sample.get('sample')} trains on turn {turns[-1]}, but the record's conversation holds "
            f"{len(assistant_at)} assistant messages: its response cannot be rebuilt"
        )
    end = assistant_at[turns[-1] - 1] + 1
    full = renderer.token_ids(messages[:end], _images_in(messages[:end], images), chat, False)
    recorded = sample["response_tokens"]
    response = full[len(prompt) :][:recorded]
    matches = full[: len(prompt)] == prompt and len(prompt) == sample["prompt_tokens"] and len(response) == recorded
    return prompt, response, matches


def _images_in(messages: list[dict], images: list) -> list:
    count = sum(
        part.get("type") == "image"
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
    )
    return images[:count]


def loop_fields(item: LoadedRecord, renderer: ChatRenderer) -> dict:
    """The loop's ``extra_fields`` (verl's ``tool_extra_fields``) from the record's ``stats``, which keeps them
    without their ``mm_tool/`` prefix, plus ``last_assistant_text``."""
    from verl_mm_tools.agent_loop.state import PREFIX
    from verl_mm_tools.rewards.common import LAST_ASSISTANT_TEXT_KEY

    stats = item.record.get("stats") or {}
    fields = {key if key in STATS_KEYS else PREFIX + key: value for key, value in stats.items()}
    assistants = [message for message in item.record.get("messages") or [] if message.get("role") == "assistant"]
    fields[LAST_ASSISTANT_TEXT_KEY] = renderer.plain_text(assistants[-1]["text"]) if assistants else ""
    return fields


def row_columns(record: dict, reward_fn: str | None) -> dict:
    """The dataset row's columns the reward worker reads, from the record's ``sample``."""
    from verl_mm_tools.rewards.common import REWARD_FN_KEY

    sample = record.get("sample") or {}
    extra_info = dict(sample.get("extra_info") or {})
    if reward_fn is not None and REWARD_FN_KEY in extra_info:
        extra_info[REWARD_FN_KEY] = reward_fn
    return {
        "data_source": sample.get("data_source"),
        "reward_model": {"ground_truth": sample.get("ground_truth")},
        "extra_info": extra_info,
        "index": sample.get("index"),
        "uid": sample.get("uid"),
    }


def num_turns(record: dict) -> int:
    """verl's ``num_turns`` of the trajectory: assistant turns + user turns (tool and environment answers) + 1."""
    if record.get("masked"):
        return 1
    messages = record.get("messages") or []
    assistant = sum(message.get("role") == "assistant" for message in messages)
    answers = {message.get("turn") for message in messages if message.get("role") != "assistant"} - {0, None}
    return assistant + len(answers) + 1


def _data_proto(prompt: list[int], response: list[int], row: dict, fields: dict, turns: int):
    """The batch verl's ``AgentLoopWorker._compute_score`` builds for the trajectory's final sample (its code, minus
    M-RoPE): the one sample the v1 manager hands it (``adaptations.manager_tq``; several samples, right-padded as one
    sequence each, would give a manager the longest response's length for every one)."""
    import torch
    from tensordict import TensorDict
    from verl.protocol import DataProto

    input_ids = torch.tensor([prompt + response], dtype=torch.int64)
    batch = TensorDict(
        {
            "prompts": torch.tensor([prompt], dtype=torch.int64),
            "responses": torch.tensor([response], dtype=torch.int64),
            "attention_mask": torch.ones_like(input_ids),
            "input_ids": input_ids,
            "position_ids": torch.arange(input_ids.shape[1]).unsqueeze(0),
        },
        batch_size=1,
    )
    non_tensor = {key: object_array([value]) for key, value in row.items()}
    non_tensor.update(
        __num_turns__=np.array([turns]),
        tool_extra_fields=object_array([dict(fields)]),
        prompt_len=np.array([len(prompt)]),
        response_len=np.array([len(response)]),
    )
    return DataProto(batch=batch, non_tensor_batch=non_tensor)


# ----- outputs ---------------------------------------------------------------------------------------------------


def write_outputs(scored: list[Rescored], loaded: RecordSet, options: RescoreOptions) -> dict:
    """The record copies, ``rows.jsonl``, ``report.json`` and ``report.txt``; returns the report."""
    from verl_mm_tools.evaluate.report import table

    for result in scored:
        result.mode = eval_mode(result.item.path)
    scored = sorted(scored, key=_order)
    for result in scored:
        result.copy = write_copy(result, options)
    modes: dict[str, dict] = {}
    rows: list[dict] = []
    for mode, results in _by_mode(scored).items():
        figures, mode_rows = _mode_report(results, options.out)
        modes.update({_mode_name(mode, name): value for name, value in figures.items()})
        rows += mode_rows
    bad = [{"path": str(bad.path), "reason": bad.reason} for bad in loaded.bad]
    report = {
        "records": [str(path) for path in options.records],
        "rescore": options.describe(),
        "modes": modes,
        "table": table(modes),
        "bad_records": bad,
    }
    _write_lines(options.out / ROWS_FILE, rows)
    (options.out / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    (options.out / REPORT_TEXT).write_text(report_text(report) + "\n")
    return report


def _order(result: Rescored) -> tuple:
    """Rows by mode, then as the viewer lists trajectories: validation last, by step, sample index and rollout."""
    record = result.item.record
    index = (record.get("sample") or {}).get("index")
    return (
        result.mode or "",
        bool(record.get("validate")),
        record.get("step") if isinstance(record.get("step"), int) else -1,
        index if isinstance(index, int) else -1,
        record.get("rollout_n") or 0,
        str(record.get("id")),
    )


def eval_mode(path: Path) -> str | None:
    """The mode of a record in a ``verl-mm-tools eval`` output (``OUT/<mode>/trajectories/<step>/<id>/``, with
    ``OUT/report.json`` and ``OUT/<mode>/rows.jsonl``); None elsewhere."""
    parents = path.parents
    if len(parents) < 5 or parents[2].name != TRAJECTORIES:
        return None
    mode_dir = parents[3]
    return mode_dir.name if (mode_dir / EVAL_ROWS_FILE).is_file() and (parents[4] / REPORT_FILE).is_file() else None


def write_copy(result: Rescored, options: RescoreOptions) -> Path:
    """The record's folder copied to ``OUT/trajectories/<step>/<id>``, its ``reward`` the new one, the recorded one
    under ``reward_before``."""
    record = dict(result.item.record)
    target = options.out / TRAJECTORIES / _step_dir(result.item) / str(record["id"])
    shutil.copytree(result.item.folder, target)
    before = record.get("reward") or {}
    record["reward_before"] = before
    record["reward"] = {"score": result.score, "turn_rewards": before.get("turn_rewards", []), "extra": result.extra}
    record["rescored"] = {
        **options.describe(),
        "source": str(result.item.path),
        "tokens_as_recorded": result.tokens_as_recorded,
    }
    temporary = target / (RECORD_FILE + ".tmp")
    temporary.write_text(json.dumps(record, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(temporary, target / RECORD_FILE)
    return target / RECORD_FILE


def _step_dir(item: LoadedRecord) -> str:
    """The dump's step folder name (``step_NNNNNN``, ``val_step_NNNNNN``), from the record, else its parent's."""
    step = item.record.get("step")
    if isinstance(step, int):
        return f"{'val_' if item.record.get('validate') else ''}step_{step:06d}"
    parent = item.folder.parent.name
    return parent if "step_" in parent else "step_unknown"


def _by_mode(scored: list[Rescored]) -> dict[str | None, list[Rescored]]:
    groups: dict[str | None, list[Rescored]] = {}
    for result in scored:
        groups.setdefault(result.mode, []).append(result)
    return groups


def _mode_name(mode: str | None, name: str) -> str:
    return name if mode is None else f"{mode} {name}"


def _mode_report(results: list[Rescored], out: Path) -> tuple[dict, list[dict]]:
    """Eval's figures (``evaluate.report.build_report``) of the rescored scores and, when every record has one, of
    the recorded ones; the rows with both scores."""
    from verl_mm_tools.evaluate.report import build_report

    new = [result.score for result in results]
    old = [(result.item.record.get("reward") or {}).get("score") for result in results]
    samples = max(Counter(prompt_uid(result.item.record) for result in results).values())
    try:
        figures, rows = build_report(_report_columns(results, new), {}, samples)
        before = build_report(_report_columns(results, old), {}, samples)[0] if None not in old else None
    except KeyError as error:
        raise ConfigError(
            f"the records' statistics lack {error}, which this verl-mm-tools' report reads: they were written by "
            "an older verl-mm-tools; rescore them with that version"
        ) from error
    if before is None:
        logger.warning("rescore: some records have no recorded score; the report shows no 'before' figures")
    for row, result, score in zip(rows, results, old, strict=True):
        row.update(
            mode=result.mode,
            reward_before=score,
            tokens_as_recorded=result.tokens_as_recorded,
            record=str(result.copy.relative_to(out)) if result.copy else None,
            source=str(result.item.path),
        )
    return ({BEFORE: before} if before is not None else {}) | {RESCORED: figures}, rows


def prompt_uid(record: dict) -> str:
    """The prompt a record answers (eval groups a prompt's samples by it): its uid (verl's GRPO group; eval's
    row), else its step, data source and sample index, else the record alone."""
    sample = record.get("sample") or {}
    if sample.get("uid") is not None:
        return str(sample["uid"])
    if sample.get("index") is not None:  # a step's rollouts of one row (another step's are other draws)
        step = f"{'validation ' if record.get('validate') else ''}step {record.get('step')}"
        return f"{step} {sample.get('data_source')}#{sample['index']}"
    return f"record {record.get('id')}"


def _report_columns(results: list[Rescored], scores: list):
    """What eval's report reads of a generated batch: the loop's extra fields per row, the dataset row's columns
    (data source, extra_info, index, uid), its sample number (the record's rollout number) and ``rm_scores``
    (float64: the scores exactly as computed)."""
    import torch
    from verl.protocol import DataProto

    from verl_mm_tools.evaluate.report import SAMPLE_KEY

    # the keys every record has: one missing from some is missing from the columns (a KeyError the caller explains)
    keys = sorted(set.intersection(*(set(result.fields) for result in results)))
    columns = {key: object_array([result.fields[key] for result in results]) for key in keys}
    records = [result.item.record for result in results]
    samples = [record.get("sample") or {} for record in records]
    columns["data_source"] = object_array([sample.get("data_source") for sample in samples])
    columns["extra_info"] = object_array([sample.get("extra_info") for sample in samples])
    columns["index"] = object_array([sample.get("index") for sample in samples])
    columns["uid"] = object_array([prompt_uid(record) for record in records])
    columns[SAMPLE_KEY] = object_array([record.get("rollout_n") or 0 for record in records])
    rm_scores = torch.tensor([[score] for score in scores], dtype=torch.float64)
    return DataProto.from_dict(tensors={"rm_scores": rm_scores}, non_tensors=columns)


def report_text(report: dict) -> str:
    """The table, how the records were rescored, and the records that could not be."""
    settings = report["rescore"]
    lines = [
        report["table"],
        f"rescored with reward manager {settings['reward_manager']}, reward function "
        f"{settings['reward_fn'] or '(the manager default)'}",
    ]
    if report["bad_records"]:
        lines.append(f"left out {len(report['bad_records'])}:")
        lines += [f"  {described(BadRecord(Path(bad['path']), bad['reason']))}" for bad in report["bad_records"]]
    return "\n".join(lines)


def _write_lines(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
