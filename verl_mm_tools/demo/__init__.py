"""The learning demo (``verl-mm-tools demo``): verl's real trainer on the CPU backend (``verl_mm_tools.cpu``) teaching
the embedded tiny VLM a task.

- ``run``: launches and watches the trainer process (steps, stop rule, learning curve, sweeps);
- ``tasks``: the task catalogue: what each task trains and when it has learned;
- ``warm_start``: the supervised warm start that teaches the output format, never the answers;
- ``premise``: the check that the ``learn_zoom`` task's answer needs the tool
  (``python -m verl_mm_tools.demo.premise``).

The CPU backend imports nothing from here (``tests/test_layers_on_cpu.py`` checks it).
"""
