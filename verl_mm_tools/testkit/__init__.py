"""A test kit for the mm_tool loop and for your own tools: rollouts through verl's real ``AgentLoopWorker`` in one
process, answered by a scripted server (or a small model), and what to check them with.

- ``rollout.LocalRollout``: ``LocalRollout(model_dir, tools_yaml, workdir).run(turns, prompts)`` returns verl's
  generated batch, the server with the requests it saw, and the worker;
- ``scripted``: the ``ScriptedServer`` (turn k of every trajectory answered by a script), ``tool_call_text`` (a
  hermes tool call) and the log-probs and masks a scripted response must have;
- ``rows``: ``marked_image`` (a rotation shows in its pixels), ``unpadded_row`` (one sample of a batch without
  padding) and ``trainer_logprobs`` (what the trainer computes for it);
- ``sample_dump``: a small, reproducible trajectory dump (``write_sample_dump``);
- ``cluster``: several Ray nodes on this machine (``local_cluster``: a head and raylets, each with its own custom
  resource, temp and working directory), to test what a multi-node cluster does.
"""
