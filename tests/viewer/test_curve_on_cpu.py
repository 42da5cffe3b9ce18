"""The learning-curve picture: one polyline per series through each step's value, validation points, the target and
chance lines, a title that says whether the run learned; valid SVG."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

from verl_mm_tools.viewer.curve import HEIGHT, LEFT, TOP, curve_svg

SVG = "{http://www.w3.org/2000/svg}"
CURVE = {
    "task": "learn_zoom",
    "target": 0.9,
    "chance": 0.5,
    "learned": True,
    "trainer_seconds": 60.0,
    "steps": [1, 2, 3, 4],
    "reward": [0.5, 0.625, 0.875, 1.0],
    "call_rate": [0.5, 0.5, 0.75, 1.0],
    "validation": {"0": 0.5, "4": 1.0},
}


def test_the_picture_plots_reward_call_rate_validation_target_and_chance():
    root = ElementTree.fromstring(curve_svg(CURVE))
    texts = [element.text for element in root.iter(f"{SVG}text")]
    assert texts[0] == "learn_zoom: learned in 4 steps"
    assert {"training reward", "tool-call rate", "validation (greedy)", "target 0.9", "chance 0.5"} <= set(texts)
    reward, call_rate = (element.get("points").split() for element in root.iter(f"{SVG}polyline"))
    plot_height = HEIGHT - TOP - 36
    # step 4 of 4 at the right edge of the plot, reward 1.0 at its top; call rate 0.5 at mid-height
    assert reward[-1] == f"{LEFT + 640 - LEFT - 150:.1f},{TOP:.1f}"
    assert call_rate[0].split(",")[1] == f"{TOP + plot_height * 0.5:.1f}"
    validation = [(float(c.get("cx")), float(c.get("cy"))) for c in root.iter(f"{SVG}circle")][:2]
    assert validation == [(LEFT, TOP + plot_height * 0.5), (LEFT + 640 - LEFT - 150, TOP)]


def test_a_run_that_did_not_learn_says_so_and_a_curve_without_calls_has_one_line():
    curve = {**CURVE, "learned": False, "call_rate": []}
    root = ElementTree.fromstring(curve_svg(curve))
    assert next(root.iter(f"{SVG}text")).text == "learn_zoom: 4 steps, did not learn"
    assert len(list(root.iter(f"{SVG}polyline"))) == 1
