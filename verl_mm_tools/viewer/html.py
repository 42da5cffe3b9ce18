"""HTML of the viewer's pages: plain strings, every value escaped, CSS and JS inline (the pages load nothing from the
network, so a site can be opened from disk, copied, or served on a machine without internet access)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import PurePath

from verl_mm_tools.record import tools_used, trajectory_name
from verl_mm_tools.viewer.gui_actions import acted_on_images, action_view
from verl_mm_tools.viewer.videos import video_view

# The argument a tool call's code travels in (the python tool's schema: ``python(code)``); shown as a code block
CODE_ARGUMENT = "code"
TINY_MODEL_NOTE = "the embedded tiny VLM (~290k parameters, random weights plus a short warm start): not a real model"

STYLE = """
:root { --fg:#1d232b; --muted:#5b6673; --line:#d9dee4; --bg:#f6f7f9; --card:#fff; --accent:#2463eb;
        --bad:#b42318; --bad-bg:#fef3f2; --ok:#067647; --ok-bg:#ecfdf3; --tool:#f4f0ff; --env:#fff8e6; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       background: var(--bg); }
header { padding: 14px 24px; background: var(--card); border-bottom: 1px solid var(--line); }
header h1 { margin: 0; font-size: 18px; } header nav a { margin-right: 14px; }
main { padding: 16px 24px; max-width: 1200px; }
a { color: var(--accent); text-decoration: none; } a:hover { text-decoration: underline; }
.filters { display: flex; flex-wrap: wrap; gap: 10px 18px; align-items: end; padding: 12px; background: var(--card);
           border: 1px solid var(--line); border-radius: 8px; margin-bottom: 12px; }
.filters label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); gap: 3px; }
.filters input { width: 80px; } .filters input, .filters select { font: inherit; padding: 3px 5px; }
.count { color: var(--muted); margin-left: auto; }
table { border-collapse: collapse; width: 100%; background: var(--card); border: 1px solid var(--line); }
th, td { padding: 6px 8px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: middle; }
th { font-size: 12px; color: var(--muted); font-weight: 600; background: #fafbfc; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.thumbs img { height: 40px; margin-right: 3px; border: 1px solid var(--line); border-radius: 3px; }
div.strip img { height: 56px; margin-right: 3px; border: 1px solid var(--line); border-radius: 3px; }
.badge { display: inline-block; padding: 0 6px; border-radius: 9px; font-size: 12px; }
.badge.bad { background: var(--bad-bg); color: var(--bad); } .badge.ok { background: var(--ok-bg); color: var(--ok); }
.question { color: var(--muted); max-width: 340px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(330px, 1fr)); gap: 12px; margin-bottom: 16px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; }
.card h2 { font-size: 14px; margin: 0 0 8px; } .card table { border: 0; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0; }
dt { color: var(--muted); } dd { margin: 0; overflow-wrap: anywhere; }
.chat { display: flex; flex-direction: column; gap: 10px; }
.msg { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 8px 12px;
       max-width: 880px; }
.msg.assistant { align-self: flex-end; background: #eef4ff; border-color: #c7d7fe; }
.msg.tool { background: var(--tool); } .msg.environment { background: var(--env); }
.msg.error { background: var(--bad-bg); border-color: #fecdca; }
.msg .who { font-size: 12px; color: var(--muted); margin-bottom: 4px; }
.msg pre, .card pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 4px 0;
                      font: 13px/1.4 ui-monospace, monospace; }
.call { border-left: 3px solid var(--accent); padding: 2px 8px; margin: 6px 0; background: #fff; }
.call pre.code { white-space: pre; overflow-x: auto; overflow-wrap: normal; padding: 6px 8px; background: var(--bg);
                 border-radius: 4px; }
.note { font-size: 12px; color: var(--muted); font-style: italic; }
.note.resumed { color: #b45309; font-style: normal; }
tr.resumed td { background: rgba(245, 158, 11, 0.12); }
figure { display: inline-block; margin: 6px 10px 4px 0; vertical-align: top; }
figure img { display: block; max-width: 360px; max-height: 360px; min-height: 96px; image-rendering: pixelated;
             border: 1px solid var(--line); border-radius: 4px; background: #fff; }
figcaption { font-size: 12px; color: var(--muted); }
.missing { display: inline-block; padding: 20px; border: 1px dashed var(--line); color: var(--muted); }
.action { margin: 6px 0 2px; }
.action .shot { position: relative; display: inline-block; vertical-align: top; border: 1px solid var(--line); }
.action .shot img { display: block; max-width: 360px; max-height: 360px; image-rendering: pixelated; }
.action-note { font-size: 12px; color: var(--muted); overflow-wrap: anywhere; }
.action-note code, .action-note kbd { font: 12px ui-monospace, monospace; color: var(--fg); background: var(--bg);
                                      padding: 0 3px; border-radius: 3px; white-space: pre-wrap; }
.action.off-image .action-note { color: var(--bad); }
.marker { position: absolute; width: 15px; height: 15px; transform: translate(-50%, -50%); border: 2px solid #e5173f;
          border-radius: 50%; box-shadow: 0 0 0 1px #fff; pointer-events: none; }
.marker::before, .marker::after { content: ""; position: absolute; left: 50%; top: 50%; background: #e5173f;
                                  transform: translate(-50%, -50%); }
.marker::before { width: 1px; height: 21px; } .marker::after { width: 21px; height: 1px; }
"""

INDEX_SCRIPT = """
(function () {
  var byId = function (id) { return document.getElementById(id); };
  var rows = Array.prototype.slice.call(document.querySelectorAll('#trajectories tbody tr'));
  var controls = { step: 'f-step', rmin: 'f-reward-min', rmax: 'f-reward-max', tool: 'f-tool', masked: 'f-masked',
                   tmin: 'f-turns-min', tmax: 'f-turns-max', stop: 'f-stop' };
  function number(text) { return text === '' || text === undefined ? null : Number(text); }
  function current() {
    var filters = {};
    Object.keys(controls).forEach(function (key) { filters[key] = byId(controls[key]).value; });
    return filters;
  }
  function within(value, low, high) {
    if (low === null && high === null) { return true; }
    if (value === null) { return false; }
    return (low === null || value >= low) && (high === null || value <= high);
  }
  function matches(data, f) {
    var tools = data.tools ? data.tools.split(' ') : [];
    if (f.step && data.step !== f.step) { return false; }
    if (!within(number(data.reward), number(f.rmin), number(f.rmax))) { return false; }
    if (f.tool === '(none)' ? tools.length > 0 : f.tool && tools.indexOf(f.tool) < 0) { return false; }
    if (f.masked && data.masked !== f.masked) { return false; }
    if (!within(number(data.turns), number(f.tmin), number(f.tmax))) { return false; }
    return !(f.stop && data.stop !== f.stop);
  }
  function apply() {
    var f = current(), shown = 0;
    rows.forEach(function (row) { var ok = matches(row.dataset, f); row.hidden = !ok; shown += ok ? 1 : 0; });
    byId('shown').textContent = String(shown);
    var state = new URLSearchParams();
    Object.keys(f).forEach(function (key) { if (f[key] !== '') { state.set(key, f[key]); } });
    history.replaceState(null, '', state.toString() ? '#' + state.toString() : location.pathname);
  }
  var saved = new URLSearchParams(location.hash.slice(1));  // filters live in the URL: links keep them
  Object.keys(controls).forEach(function (key) {
    var control = byId(controls[key]);
    if (saved.has(key)) { control.value = saved.get(key); }
    control.addEventListener('input', apply);
    control.addEventListener('change', apply);
  });
  byId('f-reset').addEventListener('click', function () {
    Object.keys(controls).forEach(function (key) { byId(controls[key]).value = ''; });
    apply();
  });
  apply();
})();
"""


@dataclass(frozen=True)
class IndexRow:
    """What the index shows and filters on for one trajectory."""

    page: str  # relative link to the trajectory page
    id: str
    name: str  # record.trajectory_name
    model: str | None
    step: int | None
    validate: bool
    sample_index: object
    rollout_n: int | None
    question: str
    reward: float | None
    tools: tuple[str, ...]
    masked: bool | None
    turns: int | None
    stop_reason: str | None
    thumbnails: tuple[tuple[str, str], ...]  # (src, alt)
    origin: str

    @property
    def step_key(self) -> str:
        """The step filter's value: "3", "val 3", or "" when unknown."""
        if self.step is None:
            return ""
        return f"val {self.step}" if self.validate else str(self.step)


def page(title: str, body: str, script: str = "") -> str:
    scripts = f"<script>{script}</script>" if script else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>{body}{scripts}</body></html>\n"
    )


# ----- index ----------------------------------------------------------------------------------------------------


def model_note(model: str | None) -> str:
    """How a page names the model: its directory name, and what it is when it is the embedded tiny VLM."""
    if not model:
        return "model unknown (a record written before verl-mm-tools recorded it)"
    name = PurePath(model).name
    return f"model {name} ({TINY_MODEL_NOTE})" if name.startswith("tiny-") else f"model {name}"


def index_page(rows: list[IndexRow], source: str, curve: str | None = None, bad: Sequence[str] = ()) -> str:
    """The table of trajectories, under the run's learning curve (``curve``: the picture's file name) when given,
    above the records that could not be read (``bad``: one line each, its file and why)."""
    models = sorted({model_note(row.model) for row in rows})
    header = (
        f'<header><h1>Trajectories</h1><div class="note">{len(rows)} trajectories from '
        f"{escape(source)}; {escape('; '.join(models))}. Turns: the model's generations.</div></header>"
    )
    if curve:
        header += (
            f'<figure class="curve"><img src="{escape(curve)}" alt="learning curve: training reward, '
            'tool-call rate and validation reward per step"></figure>'
        )
    table = (
        '<table id="trajectories"><thead><tr><th>Step</th><th>Sample</th><th>Question</th><th>Images</th>'
        "<th>Reward</th><th>Turns</th><th>Tools</th><th>Stop</th><th>Masked</th></tr></thead><tbody>"
        + "".join(_index_row(row) for row in rows)
        + "</tbody></table>"
    )
    return page("Trajectories", f"{header}<main>{_filters(rows)}{table}{_unreadable(bad)}</main>", INDEX_SCRIPT)


def _unreadable(bad: Sequence[str]) -> str:
    if not bad:
        return ""
    items = "".join(f"<li><code>{escape(line)}</code></li>" for line in bad)
    heading = f"<h2>Left out: {len(bad)} records that could not be read</h2>"
    return f'<section id="unreadable">{heading}<ul>{items}</ul></section>'


def _filters(rows: list[IndexRow]) -> str:
    steps = sorted(
        {row.step_key for row in rows if row.step_key}, key=lambda key: (key.startswith("val"), int(key.split()[-1]))
    )
    tools = sorted({tool for row in rows for tool in row.tools})
    stops = sorted({row.stop_reason for row in rows if row.stop_reason})
    return (
        '<form class="filters" id="filters" onsubmit="return false">'
        + _select("f-step", "Step", [("", "all")] + [(step, step) for step in steps])
        + _number("f-reward-min", "Reward ≥")
        + _number("f-reward-max", "Reward ≤")
        + _select("f-tool", "Tool used", [("", "any"), ("(none)", "no tool")] + [(tool, tool) for tool in tools])
        + _select("f-masked", "Masked", [("", "any"), ("1", "masked"), ("0", "not masked")])
        + _number("f-turns-min", "Turns ≥", step="1")
        + _number("f-turns-max", "Turns ≤", step="1")
        + _select("f-stop", "Stop reason", [("", "any")] + [(stop, stop) for stop in stops])
        + '<button type="button" id="f-reset">Reset</button>'
        + f'<span class="count"><span id="shown">{len(rows)}</span> of {len(rows)} shown</span></form>'
    )


def _select(control_id: str, label: str, options: list[tuple[str, str]]) -> str:
    items = "".join(f'<option value="{escape(value)}">{escape(text)}</option>' for value, text in options)
    return f'<label>{escape(label)}<select id="{control_id}">{items}</select></label>'


def _number(control_id: str, label: str, step: str = "any") -> str:
    return f'<label>{escape(label)}<input type="number" step="{step}" id="{control_id}"></label>'


def _index_row(row: IndexRow) -> str:
    data = {
        "id": row.id,
        "step": row.step_key,
        "reward": "" if row.reward is None else repr(float(row.reward)),
        "tools": " ".join(row.tools),
        "masked": "" if row.masked is None else str(int(row.masked)),
        "turns": "" if row.turns is None else str(row.turns),
        "stop": row.stop_reason or "",
    }
    attributes = " ".join(f'data-{key}="{escape(value)}"' for key, value in data.items())
    thumbs = "".join(f'<img src="{escape(src)}" alt="{escape(alt)}">' for src, alt in row.thumbnails)
    masked = "" if row.masked is None else _badge("masked", "bad") if row.masked else _badge("no", "ok")
    return (
        f"<tr {attributes}><td>{escape(row.step_key or '—')}</td>"
        f'<td><a href="{escape(row.page)}">{escape(row.name)}</a></td>'
        f'<td class="question" title="{escape(row.question)}">{escape(row.question)}</td>'
        f'<td class="thumbs">{thumbs}</td><td class="num">{escape(_number_text(row.reward))}</td>'
        f'<td class="num">{escape(str(row.turns) if row.turns is not None else "—")}</td>'
        f"<td>{escape(', '.join(row.tools))}</td><td>{escape(row.stop_reason or '—')}</td><td>{masked}</td></tr>"
    )


def _badge(text: str, kind: str) -> str:
    return f'<span class="badge {kind}">{escape(text)}</span>'


def _number_text(value: object) -> str:
    if value is None:
        return "—"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# ----- trajectory page ------------------------------------------------------------------------------------------


def trajectory_page(
    record: dict, image_base: str | None, index_link: str, neighbours: tuple[str | None, str | None]
) -> str:
    """``image_base``: the URL prefix of the record's image files (None: the record has no image files)."""
    previous, following = neighbours
    nav = f'<a href="{escape(index_link)}">← all trajectories</a>'
    nav += f'<a href="{escape(previous)}">‹ previous</a>' if previous else ""
    nav += f'<a href="{escape(following)}">next ›</a>' if following else ""
    name = trajectory_name(record)
    header = (
        f"<header><nav>{nav}</nav><h1>{escape(name)}</h1>"
        f'<div class="note">{escape(model_note(record.get("model")))}</div></header>'
    )
    cards = _summary_card(record) + _reward_card(record)
    messages = record.get("messages", [])
    acted = acted_on_images(messages)
    chat = "".join(
        _message(message, record, image_base, acted.get(index, {})) for index, message in enumerate(messages)
    )
    details = _details("Statistics (mm_tool extra fields)", record.get("stats"))
    details += _details("Timing (s)", record.get("timing"))
    body = f'{header}<main><div class="grid">{cards}</div><div class="chat" id="chat">{chat}</div>{details}</main>'
    return page(f"Trajectory: {name}", body)


def _summary_card(record: dict) -> str:
    sample = record.get("sample") or {}
    step = record.get("step")
    fields = [
        ("Step", "—" if step is None else f"{step} (validation)" if record.get("validate") else str(step)),
        ("Dump id", record.get("id")),
        ("Sample index", sample.get("index")),
        ("Rollout", record.get("rollout_n")),
        ("uid", sample.get("uid")),
        ("Data source", sample.get("data_source")),
        ("Ground truth", sample.get("ground_truth")),
        ("Request id", record.get("request_id")),
        ("Stop reason", record.get("stop_reason")),
        ("Masked", record.get("masked")),
        ("Error", record.get("error") or None),
        ("Images", len(record.get("images") or [])),
        ("Tools used", ", ".join(tools_used(record)) or None),
    ]
    known = [(name, value) for name, value in fields if value is not None]
    return f'<section class="card" id="summary"><h2>Trajectory</h2><dl>{_items(known)}</dl></section>'


def _reward_card(record: dict) -> str:
    reward = record.get("reward") or {}
    if "reward_before" in record:  # rescored by verl-mm-tools rescore: the new score and the recorded one
        score = _rescored_scores(record)
    else:
        score = (
            f'<dt title="sum of rm_scores">Score (rm_scores)</dt>'
            f'<dd id="score">{escape(_number_text(reward.get("score")))}</dd>'
        )
    extra = _items([(key, value) for key, value in (reward.get("extra") or {}).items() if value is not None])
    totals = _items([(key.replace("_", " "), value) for key, value in (record.get("mask") or {}).items()])
    return (
        f'<section class="card" id="reward"><h2>Reward</h2><dl>{score}{extra}</dl>'
        f'<h2 style="margin-top:10px">Turns and mask</h2>{_turns_table(record.get("turns") or [])}'
        f"{_samples_table(record.get('samples') or [])}<dl>{totals}</dl></section>"
    )


def _rescored_scores(record: dict) -> str:
    """Both scores of a rescored record (``verl-mm-tools rescore``) and what rescored it."""
    settings = record.get("rescored") or {}
    function = settings.get("reward_fn") or "its default function"
    judge = settings.get("judge")
    if isinstance(judge, dict):  # rescore --judge: judge_reward, the reward function its rule reward
        rule = f" plus {settings['reward_fn']}" if settings.get("reward_fn") else ""
        function = f"judge_reward by {judge.get('model')}{rule}"
    how = f"{settings.get('reward_manager')} manager, {function}"
    before = (record.get("reward_before") or {}).get("score")
    return (
        f'<dt title="the reward manager score when rescored">Score (rescored)</dt>'
        f'<dd id="score">{escape(_number_text((record.get("reward") or {}).get("score")))}</dd>'
        f'<dt title="the score as recorded (sum of rm_scores)">Score before rescoring</dt>'
        f'<dd id="score-before">{escape(_number_text(before))}</dd>'
        f'<dt>Rescored with</dt><dd id="rescored">{escape(how)}</dd>'
    )


def _samples_table(samples: list[dict]) -> str:
    """The training samples of a trajectory exported as several (mm_tool export per_turn / auto): which turns each
    trains on and its tokens (its prompt re-renders the history)."""
    if len(samples) < 2:
        return ""
    rows = "".join(
        f"<tr><td>{sample['sample'] + 1}</td><td>{', '.join(map(str, sample['turns']))}</td>"
        f'<td class="num">{sample["prompt_tokens"]}</td><td class="num">{sample["trained_tokens"]}</td>'
        f'<td class="num">{sample["response_tokens"] - sample["trained_tokens"]}</td>'
        f'<td class="num">{sample["images"]}</td></tr>'
        for sample in samples
    )
    return (
        '<table id="samples"><thead><tr><th>Sample</th><th>Trains on turns</th><th>Prompt tokens</th>'
        "<th>Trained tokens</th><th>Context tokens</th><th>Images</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _turns_table(turns: list[dict]) -> str:
    if not turns:
        return ""
    versions = any(turn.get("weight_versions") for turn in turns)  # records of version 5 on, from engines reporting
    rows = "".join(
        f"<tr{' class=resumed' if _resumed(turn) else ''}><td>{turn['turn']}</td>"
        f'<td class="num">{turn["trained_tokens"]}</td><td class="num">{turn["context_tokens_after"]}</td>'
        f'<td class="num">{escape(_number_text(turn.get("reward")))}</td>'
        + (f"<td>{escape(_versions_text(turn.get('weight_versions')))}</td>" if versions else "")
        + "</tr>"
        for turn in turns
    )
    return (
        '<table id="turns"><thead><tr><th>Turn</th><th>Trained tokens</th><th>Context tokens after</th>'
        f"<th>Turn reward</th>{'<th>Weights</th>' if versions else ''}</tr></thead><tbody>{rows}</tbody></table>"
    )


def _resumed(turn: dict | None) -> bool:
    """Whether a weight sync interrupted the turn's generation and verl's fully async client resumed it."""
    versions = (turn or {}).get("weight_versions") or []
    return len(versions) == 2 and versions[0] != versions[1]


def _versions_text(versions: list | None) -> str:
    if not versions:
        return "?"
    first, last = versions
    return f"v{first}" if first == last else f"v{first} → v{last}, resumed"


def _resumed_note(message: dict, record: dict) -> str:
    """Where an assistant turn was resumed: the weights it was generated under, before and after the sync."""
    turns = record.get("turns") or []
    index = message.get("turn") or 0
    turn = turns[index - 1] if message.get("role") == "assistant" and 0 < index <= len(turns) else None
    if turn is None or not _resumed(turn):
        return ""
    first, last = turn["weight_versions"]
    return (
        f'<div class="note resumed">resumed: a weight sync interrupted this generation, which continued from its '
        f"tokens so far (weights v{first} → v{last}, partial rollout)</div>"
    )


def _items(fields: list[tuple[str, object]]) -> str:
    """Definition-list items (put inside a <dl>)."""
    return "".join(f"<dt>{escape(name)}</dt><dd>{escape(_text(value))}</dd>" for name, value in fields)


def _message(message: dict, record: dict, image_base: str | None, acted_on: Mapping[int, int]) -> str:
    """``acted_on``: call position -> the id of the image the call acted on (``gui_actions.acted_on_images``)."""
    role = message.get("role", "?")
    kind = "environment" if role == "user" and message.get("turn") else role
    classes = f"msg {kind}" + (" error" if message.get("error") else "")
    who = f"{kind} · turn {message['turn']}" if message.get("turn") else f"{kind} · prompt"
    images = {image["id"]: image for image in record.get("images") or []}
    image_ids = message.get("image_ids") or []
    figures = "".join(_figure(images.get(image_id), image_id, image_base) for image_id in image_ids)
    videos = {video["id"]: video for video in record.get("videos") or []}
    figures = "".join(video_view(videos[video_id], image_base) for video_id in message.get("video_ids") or []) + figures
    calls = "".join(
        _call(call, action_view(call, images.get(acted_on.get(position)), image_base))
        for position, call in enumerate(message.get("tool_calls") or [])
    )
    note = f'<div class="note">{escape(message["note"])}</div>' if message.get("note") else ""
    note += _resumed_note(message, record)
    text = f'<pre class="text">{escape(message.get("text") or "")}</pre>' if message.get("text") else ""
    return f'<section class="{classes}"><div class="who">{escape(who)}</div>{figures}{text}{calls}{note}</section>'


def _call(call: dict, action: str = "") -> str:
    """A tool call: its name, then a ``code`` string argument (the python tool's) as a code block and the other
    arguments as JSON; arguments without one (or not an object: what the model wrote when it was no JSON) as JSON.
    ``action``: the call drawn on the screenshot it acted on (``gui_actions``), under its arguments."""
    name = f"<b>{escape(str(call.get('name')))}</b>"
    arguments = call.get("arguments")
    if not isinstance(arguments, dict) or not isinstance(arguments.get(CODE_ARGUMENT), str):
        return f'<div class="call">{name}<pre>{escape(_json(arguments))}</pre>{action}</div>'
    others = {key: value for key, value in arguments.items() if key != CODE_ARGUMENT}
    rest = f"<pre>{escape(_json(others))}</pre>" if others else ""
    code = escape(arguments[CODE_ARGUMENT])
    return f'<div class="call">{name}<pre class="code"><code>{code}</code></pre>{rest}{action}</div>'


def _figure(image: dict | None, image_id: int, image_base: str | None) -> str:
    caption = f"Image {image_id}"
    if image and image.get("width"):
        caption += f" · {image['source']} · {image['width']}×{image['height']}"
    caption = f"<figcaption>{escape(caption)}</figcaption>"
    if not image or not image.get("file") or image_base is None:
        return f'<figure id="image-{image_id}"><span class="missing">pixels not dumped</span>{caption}</figure>'
    src = escape(f"{image_base}/{image['file']}")
    picture = f'<img src="{src}" alt="Image {image_id}" data-image-id="{image_id}">'
    return f'<figure id="image-{image_id}"><a href="{src}">{picture}</a>{caption}</figure>'


def _details(title: str, values: dict | None) -> str:
    if not values:
        return ""
    return (
        f'<details class="card" style="margin-top:12px"><summary>{escape(title)}</summary>'
        f"<pre>{escape(_json(values))}</pre></details>"
    )


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1) if not isinstance(value, str) else value


def _text(value: object) -> str:
    if isinstance(value, float):
        return _number_text(value)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
