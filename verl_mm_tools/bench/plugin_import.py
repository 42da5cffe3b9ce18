"""Figure 10: what the plugin costs each process that imports verl (issue #63). verl loads its plugins inside ``import
verl``, so the TaskRunner, every actor, rollout, agent-loop and reward worker of a run pays for ours. Fresh
interpreters run ``import verl`` with the plugin and without (``VERL_USE_EXTERNAL_PLUGINS=none``), in interleaved
pairs, with the CPU platform selected (as every CPU run is): each one's CPU seconds and peak RSS, and the modules the
plugin adds that are not its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from verl_mm_tools.bench.figures import Figure, figure

CHILD = (
    "import json, resource, sys, time\n"
    "import verl\n"
    "print(json.dumps({'cpu_s': time.process_time(), 'peak_kb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,"
    " 'modules': sorted(sys.modules)}))"
)
WITH, WITHOUT = "auto", "none"  # VERL_USE_EXTERNAL_PLUGINS: every plugin, none


def import_figures(pairs: int) -> list[Figure]:
    """``import/verl/{with,without}_plugins_cpu_s``, their paired ratio (target <= 1.05), the peak RSS the plugin
    adds (MB, target <= 10) and the modules it adds outside ``verl_mm_tools`` (counted, target 0)."""
    runs: dict[str, list[dict]] = {WITH: [], WITHOUT: []}
    for _ in range(pairs):
        for plugins in runs:
            runs[plugins].append(_import_verl(plugins))
    cpu = {plugins: [run["cpu_s"] for run in found] for plugins, found in runs.items()}
    added_kb = [a["peak_kb"] - b["peak_kb"] for a, b in zip(runs[WITH], runs[WITHOUT])]
    foreign = set(runs[WITH][0]["modules"]) - set(runs[WITHOUT][0]["modules"])
    foreign = {name for name in foreign if name.split(".")[0] != "verl_mm_tools"}
    return [
        figure("import/verl/with_plugins_cpu_s", cpu[WITH]),
        figure("import/verl/without_plugins_cpu_s", cpu[WITHOUT]),
        figure(
            "import/verl/with_over_without_plugins_cpu", [a / b for a, b in zip(cpu[WITH], cpu[WITHOUT])], "<= 1.05"
        ),
        figure("import/verl/plugin_peak_rss_added_MB", [kb / 1024 for kb in added_kb], "<= 10"),
        figure("import/verl/plugin_modules_outside_the_package", [len(foreign)], "<= 0"),
    ]


def _import_verl(plugins: str) -> dict:
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": plugins, "VERL_PLATFORM": "cpu"}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"import verl failed (VERL_USE_EXTERNAL_PLUGINS={plugins}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])
