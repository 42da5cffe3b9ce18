"""The learning demo (``verl-mm-tools demo``): verl's real trainer on the CPU backend (``verl_mm_tools.cpu``) teaching
the embedded tiny VLM a task.

- ``run``: the demo's steps in order (``run_demo``); its parts: ``options`` (``DemoOptions``, checked), ``prepare``
  (model, data, config files; ``DemoPaths``), ``overrides`` (the trainer's command), ``watch`` (the trainer process,
  its steps and the stop rule), ``metrics`` (verl's step metrics, the step line), ``summary`` (the learning curve
  and the closing lines); ``sweep``: several seeds;
- ``tasks``: the task catalogue: what each task trains and when it has learned;
- ``warm_start``: the supervised warm start that teaches the output format, never the answers; its parts:
  ``format_tasks`` (the demonstrations' formats, ``WarmStartSpec``), ``demonstrations`` and ``fit``;
  ``cold_start``: the same fitted by verl's SFT trainer;
- ``premise``: the check that the ``learn_zoom`` task's answer needs the tool
  (``python -m verl_mm_tools.demo.premise``).

The CPU backend imports nothing from here (``tests/test_layers_on_cpu.py`` checks it).
"""
