"""The trainer-side step hook: what runs on the trainer's side of every step, before it trains, on both of verl's
trainers.

- ``step``: ``process_step``, the one hook body: the step's ``mm_tool/*`` metrics, per-turn rewards, the guard that
  stops a run training on masked trajectories (``MaskedBatchError``) and the tool-use collapse warning
  (``CallRateWatch``);
- ``batch``: a batch as either trainer hands it over, read per row through the loop's typed hand-off
  (``handoff.SampleFields``; the metrics are ``step_metrics``);
- ``dump``: the dumps' finalisation (phase 2; the loop stages them: ``agent_loop/dump.py``);
- ``replay_buffer``: the v1 trainer's hook, a custom sampler (``MMToolReplayBuffer``);
- ``manager``: the classic trainer's hook, an agent-loop manager (``MMToolAgentLoopManager``).

Which hook a run has, and the overrides that select it, are in ``agent_loop/hook_config.py``: the loop checks them
at start-up, so they live below this package.
"""
