"""What ``verl-mm-tools rescore`` is asked (``RescoreOptions``) and the layout of what it writes. Light: the command's
parser reads it without loading verl."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from verl_mm_tools.evaluate.judging import JudgeFlags

DEFAULT_MANAGER = "mm_turn_discount"  # the manager training and eval default to
TRAJECTORIES = "trajectories"
REPORT_FILE, REPORT_TEXT, ROWS_FILE = "report.json", "report.txt", "rows.jsonl"
SETTINGS_FILE = "rescore.json"  # written first: marks the folder as a rescore output (even one cut short)


@dataclass(frozen=True)
class RescoreOptions:
    records: tuple[Path, ...]  # dump folders, eval output folders or trajectory.json files
    out: Path
    reward_fn: str | None = None  # a built-in reward function (REWARD_FUNCTIONS)
    reward_manager: str = DEFAULT_MANAGER  # a name in verl's reward-manager registry
    model_path: str | None = None  # the tokenizer and processor (default: each record's ``model``)
    overrides: tuple[str, ...] = ()  # hydra overrides of verl's trainer config (reward settings), last
    # a VLM judge scores every record (``judge_reward``), ``reward_fn`` its rule reward when given; its ``images``
    # choose among each record's tool images
    judge: JudgeFlags | None = None

    def describe(self) -> dict:
        described = {
            "reward_fn": self.reward_fn,
            "reward_manager": self.reward_manager,
            "overrides": list(self.overrides),
            "model_path": self.model_path,
        }
        return described if self.judge is None else {**described, "judge": self.judge.describe()}
