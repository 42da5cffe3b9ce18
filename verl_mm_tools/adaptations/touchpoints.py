"""The one row of the inventory whose code is no module of the package: what ``setup.py`` declares for verl.
Every other record is declared beside its code (``record.Adaptation``'s decorators). Imports nothing of verl."""

from __future__ import annotations

from verl_mm_tools.adaptations.record import Adaptation, Section

PACKAGING = Adaptation(
    files=("setup.py",),
    section=Section.CONFIGURATION,
    what="declares `cachetools`, `fastapi`, `uvicorn`, `mathruler`, `psutil` and `TransferQueue`, which verl's code "
    "imports without declaring them (TransferQueue only in verl's `verl-core` extra)",
    why="a plain `pip install verl==0.9.1` cannot run its agent loops, reward scoring or v1 trainer",
    applies_to="verl 0.9.1",
    proof="`tests/test_packaging_on_cpu.py::test_verl_still_leaves_out_what_its_code_imports_and_we_declare_it`"
    " (added with this inventory)",
)
