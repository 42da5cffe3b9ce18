"""What changed, shown on trajectories: one dumped trajectory of the first training step and one of the last, as the
viewer would show them, in text. Not chosen for how they look: the first trajectory dumped for each step (the dumps
take the step's first trajectories, ``dump_max_per_step``)."""

from __future__ import annotations

from pathlib import Path

from verl_mm_tools.viewer.loading import Trajectory, ViewerError, load_trajectories

MESSAGE_CHARS = 150  # a message's text is cut to this on the screen (the viewer shows it whole)


def before_and_after(trajectories: Path) -> list[str]:
    """Lines showing the first dumped training trajectory of the first step and of the last; none without dumps."""
    try:
        found = [item for item in load_trajectories(trajectories) if item.origin == "dump"]
    except ViewerError:
        return []
    training = [item for item in found if not item.record.get("validate") and item.record.get("step") is not None]
    if not training:
        return []
    first_step, last_step = training[0].record["step"], training[-1].record["step"]
    first = training[0]
    last = next(item for item in training if item.record["step"] == last_step)
    lines = describe("before", first)
    if last_step != first_step:
        lines += describe("after", last)
    return lines


def describe(label: str, trajectory: Trajectory) -> list[str]:
    """A header (step, reward, truth) and one line per message after the prompt; images as [image N, WxH]."""
    record = trajectory.record
    score = (record.get("reward") or {}).get("score")
    truth = (record.get("sample") or {}).get("ground_truth")
    header = f"{label} (step {record['step']}, reward {score if score is None else f'{score:.2f}'}, answer {truth}):"
    sizes = {image["id"]: f"{image['width']}x{image['height']}" for image in record.get("images", [])}
    lines = [header]
    for message in record["messages"]:
        if message["turn"] == 0:
            continue
        images = "".join(f"[image {image_id}, {sizes.get(image_id, '?')}] " for image_id in message["image_ids"])
        text = " ".join(message["text"].split())
        if len(text) > MESSAGE_CHARS:
            text = text[: MESSAGE_CHARS - 3] + "..."
        lines.append(f"  {message['role']:>9}: {images}{text}")
    return lines
