"""The in-process runtime that ``eval``, ``rescore``, the demo, the benchmarks and the tests share: verl's own worker
classes (``AgentLoopWorker``, ``RewardLoopWorker``, verl-mm-tools' agent-loop manager) run in one process, no Ray, no
GPU; and a Ray cluster of several nodes on one machine.

- ``config``: verl's composed trainer config (``compose_trainer_config``) and the classic step hook's overrides;
- ``workers``: the workers and the manager in-process, run on verl's event loop (``make_worker``,
  ``in_process_manager``, ``generate``, ``InProcessActor``), with the loop registry restored afterwards;
- ``batch``: generation batches of raw prompts (``image_prompt``, ``make_batch``, ``object_array``) and one sample of
  a generated batch without its padding (``unpadded_row``);
- ``scripted_client``: a client of verl's LLM server interface whose model's turns a script writes
  (``ScriptedClient``), and the text of a tool call (``tool_call_text``);
- ``rollout``: rollouts through the worker (``LocalRollout``) or, one batch per step, through the manager with
  verl's reward worker (``run_steps``), answered by a ``ScriptedClient``: how the demo records its demonstrations;
- ``cluster``: several Ray nodes on this machine (``local_cluster``: a head and raylets, each with its own custom
  resource, temp and working directory), for ``demo --nodes 2`` and to test what a multi-node cluster does.

The test kit (``verl_mm_tools.testkit``) adds a scripted server a model can answer, marked images and sample dumps.
"""
