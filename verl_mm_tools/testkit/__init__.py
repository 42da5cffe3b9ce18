"""A test kit for the mm_tool loop and for your own tools, on the runtime's rollouts (``runtime.rollout.LocalRollout``:
verl's real ``AgentLoopWorker`` in one process, answered by a scripted client): what stands in for a model and what
to check the rollouts with.

- ``scripted``: the ``ScriptedServer`` (the runtime's ``ScriptedClient``, whose turns a model can generate or score
  too), the log-probs and masks a scripted response must have, and the prefix-cache hits a stand-in reports;
- ``rollout``: ``rotate_rollout`` (a ``LocalRollout`` of the mm_tool loop with the rotate tool);
- ``rows``: ``marked_image`` (a rotation shows in its pixels) and ``trainer_logprobs`` (what the trainer computes
  for a sample of a generated batch);
- ``sample_dump``: a small, reproducible trajectory dump (``write_sample_dump``);
- ``resume``: partial rollout without a trainer (``InterruptingServer``, ``resuming_client``).
"""
