"""A learning curve as an SVG picture: the training reward and the tool-call rate per step, the greedy validation
reward where it was measured, the target and chance lines. Written by ``verl-mm-tools demo`` next to
``learning_curve.json`` (whose dict it reads) and shown by the viewer; plain SVG, no plotting library."""

from __future__ import annotations

from html import escape

CURVE_PICTURE = "learning_curve.svg"  # next to learning_curve.json, in the folder above the trajectory dumps
WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 48, 150, 34, 36  # margins: the legend sits right of the plot
SERIES = (  # key in the curve, label, colour
    ("reward", "training reward", "#1f77b4"),
    ("call_rate", "tool-call rate", "#ff7f0e"),
)
VALIDATION_COLOUR = "#2ca02c"


def curve_svg(curve: dict) -> str:
    """The picture of a ``learning_curve.json`` dict (``steps``, ``reward``, ``validation``; ``call_rate``,
    ``target``, ``chance``, ``task`` where present)."""
    steps = curve["steps"]
    last = max([*steps, *map(int, curve.get("validation", {})), 1])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(step: float) -> float:
        return LEFT + plot_w * step / last

    def y(value: float) -> float:
        return TOP + plot_h * (1 - min(max(value, 0.0), 1.0))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="18" font-size="13">{escape(_title(curve))}</text>',
    ]
    for value in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#e5e5e5"/>'
        )
        parts.append(f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{value:g}</text>')
    for step in _ticks(last):
        parts.append(f'<text x="{x(step):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{step}</text>')
    parts.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 4}" text-anchor="middle">training step</text>')
    legend: list[tuple[str, str | None]] = []  # (label, stroke; None: a validation dot)
    for key, dash, label in (("target", "6 4", "target"), ("chance", "2 3", "chance")):
        if curve.get(key) is not None:
            parts.append(
                f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(curve[key]):.1f}" y2="{y(curve[key]):.1f}" '
                f'stroke="#777" stroke-dasharray="{dash}"/>'
            )
            legend.append((f"{label} {curve[key]:g}", f'stroke="#777" stroke-dasharray="{dash}"'))
    for key, label, colour in SERIES:
        values = curve.get(key) or []
        if values:
            points = " ".join(f"{x(step):.1f},{y(value):.1f}" for step, value in zip(steps, values, strict=True))
            parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
            legend.append((label, f'stroke="{colour}" stroke-width="2"'))
    validation = curve.get("validation") or {}
    for step, value in validation.items():
        parts.append(f'<circle cx="{x(int(step)):.1f}" cy="{y(value):.1f}" r="4" fill="{VALIDATION_COLOUR}"/>')
    if validation:
        legend.append(("validation (greedy)", None))
    for row, (label, stroke) in enumerate(legend):
        top = TOP + 8 + 18 * row
        left = LEFT + plot_w + 14
        if stroke is None:
            parts.append(f'<circle cx="{left + 10}" cy="{top}" r="4" fill="{VALIDATION_COLOUR}"/>')
        else:
            parts.append(f'<line x1="{left}" x2="{left + 20}" y1="{top}" y2="{top}" {stroke}/>')
        parts.append(f'<text x="{left + 26}" y="{top + 4}">{escape(label)}</text>')
    parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _title(curve: dict) -> str:
    task = curve.get("task", "training")
    if curve.get("learned"):
        return f"{task}: learned in {len(curve['steps'])} steps"
    return f"{task}: {len(curve['steps'])} steps" + (", did not learn" if "learned" in curve else "")


def _ticks(last: int) -> list[int]:
    """About five round step numbers from 0 to ``last``."""
    step = next(size for size in (1, 2, 5, 10, 20, 25, 50, 100, 200, 500, 1000, 10**9) if last / size <= 6)
    return list(range(0, last + 1, step))
