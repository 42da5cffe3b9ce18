"""The in-process runtime that ``eval``, ``rescore``, the demo, the benchmarks and the tests share: verl's own worker
classes (``AgentLoopWorker``, ``RewardLoopWorker``, verl-mm-tools' agent-loop manager) run in one process, no Ray, no
GPU.

- ``config``: verl's composed trainer config (``compose_trainer_config``) and the classic step hook's overrides;
- ``workers``: the workers and the manager in-process, run on verl's event loop (``make_worker``,
  ``in_process_manager``, ``generate``, ``InProcessActor``), with the loop registry restored afterwards;
- ``batch``: generation batches of raw prompts (``image_prompt``, ``make_batch``, ``object_array``).

Scripted servers and one-call rollouts for tests are in ``verl_mm_tools.testkit``.
"""
