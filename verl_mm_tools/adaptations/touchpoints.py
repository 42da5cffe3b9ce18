"""The rows of the inventory that replace no code of verl's: how the plugin loads and registers, extension-point
subclasses and the verl methods the mm_tool loop copies, configuration and packaging workarounds. Their code lives with
what they serve; a subclass or a copy is pinned by the sha256 of the verl code it overrides or copies, which
``tests/adaptations/test_records_on_cpu.py`` checks against the installed verl and ``guard.confirm`` checks where that
code is used (a changed target refuses to start, as every other row's does). Imports nothing of verl."""

from __future__ import annotations

from verl_mm_tools.adaptations.record import Adaptation, Section, Target

TOUCHPOINTS: tuple[Adaptation, ...] = (
    Adaptation(
        row=12,
        section=Section.IMPORT_ORDER,
        where="`adaptations/import_order.py`: `import_first` (installed by `verl_mm_tools/__init__.py`)",
        what="imports verl just before the first of our modules that may need it (all but `LIGHT_MODULES`)",
        why=(
            "verl imports our plugin inside `import verl`; had one of our modules imported verl first, the "
            "plugin would find it half-initialised (an import cycle). Keeps `import verl_mm_tools` and the "
            "CLI's parser free of verl's ~5 s import"
        ),
        applies_to="verl 0.9.1 (loads plugins in `verl/__init__.py`)",
        proof=(
            "the cycle, with a stand-in for verl: "
            "`tests/adaptations/test_import_order_on_cpu.py::test_import_first_breaks_the_plugin_import_cycle[False]`;"
            " that verl loads the plugin inside `import verl`: "
            "`tests/test_plugin_on_cpu.py::test_import_verl_registers_mm_tool_through_the_installed_entry_point`."
            " None on verl itself without the hook"
        ),
    ),
    Adaptation(
        row=13,
        section=Section.IMPORT_ORDER,
        where="`adaptations/import_order.py`: `call_after_import` (used by `verl_registry.when_imported`, "
        "`adaptations/fixes/__init__.py` and `adaptations/cpu/__init__.py`)",
        what=(
            "runs a function right after a verl module's code ran: fills each of verl's registries (agent loops, "
            "reward managers, advantage estimators, checkpoint engines, rollouts) and applies the verl fixes (rows "
            "2-3, 9, 24-27, 29-31, 34, 38, 40 and 42) and the CPU patches (rows 4-8, 32, 33) only when verl "
            "imports that module"
        ),
        why=(
            "every process that imports verl loads the plugin; importing those modules at its load made every "
            "`import verl` load 1,323 more modules (vLLM and torch's inductor through verl's checkpoint engines, "
            "verl's reward loop and worker configs): ~2.5 s and ~100 MiB per process"
        ),
        applies_to="any",
        proof="none (a start-up cost, not a bug); that `import verl` loads none of verl's modules more: "
        "`tests/test_plugin_on_cpu.py::test_the_plugin_adds_only_its_own_modules_to_import_verl`",
    ),
    Adaptation(
        row=14,
        section=Section.IMPORT_ORDER,
        where="`plugin.py`: `_register_or_report`, `_register_agent_loops_or_report`",
        what=(
            "logs any registration failure at ERROR with its traceback, then re-raises (the lazily "
            "registered agent loop: logs only, so verl's agent-loop module stays usable)"
        ),
        why="verl's entry-point loader logs a failing plugin at DEBUG: a broken plugin would silently vanish",
        applies_to="verl 0.9.1",
        proof=(
            "`tests/test_plugin_on_cpu.py::test_verls_own_loader_still_hides_a_failing_plugin_below_info` "
            "(added with this inventory)"
        ),
    ),
    Adaptation(
        row=15,
        section=Section.PRIVATE_STATE,
        where="`plugin.py`: `register_agent_loops_into`",
        targets=(
            Target(
                "verl.experimental.agent_loop.agent_loop",
                "register",
                "d4713a91cdbbbe838a94a77d7089c113f63b95b0d635796db0b24c5fb25389bb",
            ),
        ),
        what=('writes `{"_target_": "verl_mm_tools.agent_loop.MMToolAgentLoop"}` into `_agent_loop_registry` directly'),
        why="verl's `register` decorator needs the class, whose import costs seconds at every `import verl`",
        applies_to="verl 0.9.1",
        proof=(
            "none (not a bug); works: "
            "`tests/test_plugin_on_cpu.py::test_import_verl_registers_mm_tool_through_the_installed_entry_point`"
        ),
    ),
    Adaptation(
        row=16,
        section=Section.PRIVATE_STATE,
        where="`cpu/__init__.py`: `register_cpu_backend`",
        what=(
            "`PlatformRegistry._platforms`, `RolloutReplicaRegistry._registry` (a lazy loader), "
            '`rollout.base._ROLLOUT_REGISTRY[("hf", "async")]`, `CheckpointEngineRegistry._registry`'
        ),
        why=(
            "verl has no public API for the worker-side rollout class; the others are written directly so "
            "that `register_unique` (`verl_registry.py`) can refuse to overwrite another package's entry"
        ),
        applies_to="verl 0.9.1",
        proof=(
            "none (not a bug); works: `tests/cpu/test_platform_on_cpu.py`, "
            "`tests/cpu/test_checkpoint_engine_on_cpu.py::test_the_backend_is_registered_with_verl`"
        ),
    ),
    Adaptation(
        row=17,
        section=Section.EXTENSIONS,
        where=(
            "`agent_loop/`: `MMToolAgentLoop(ToolAgentLoop)` — **the parts of verl's `ToolAgentLoop` it re-implements**"
            "; its targets checked when a loop is built (`guard.confirm`)"
        ),
        targets=(
            Target(
                "verl.experimental.agent_loop.tool_agent_loop",
                "ToolAgentLoop.run",
                "4d3b05be93f3261c1f4d0d4d9b3283e88d5b5de57515d585c32a6ff698b1ad0f",
            ),
            Target(
                "verl.experimental.agent_loop.tool_agent_loop",
                "ToolAgentLoop._handle_pending_state",
                "87d7a6091d94434296d155cc92860415c344da31804a9220a9ed69f01641b82c",
            ),
            Target(
                "verl.experimental.agent_loop.tool_agent_loop",
                "ToolAgentLoop._handle_processing_tools_state",
                "6fb81493273afe9bce07bd497cb77e8d4a29fa62321eb70480fc0561ea12c765",
            ),
        ),
        what=(
            "calls verl's `_handle_generating_state` (generation, Continuous-Token merge, tool parsing), "
            "`ct_build_initial_tokens`, `ct_merge_context_msg` and its helpers as they are; re-implements "
            "`run()` (AgentData and per-sample tool selection in `agent_loop/prompt.py`, the output's fields"
            " in `agent_loop/output.py`), `_handle_pending_state` (renders the resolved tool format) and "
            "`_handle_processing_tools_state` (`agent_loop/tool_runner.py` and `_merge_context_turn`: "
            "sessions, timeouts, image budget, rollback)"
        ),
        why=(
            "verl's `run()` has no hook for the trajectory's state, environments, failure isolation or "
            "several samples, and its tool state creates a tool per call, gathers calls in parallel and "
            "admits every image"
        ),
        applies_to="verl 0.9.1",
        proof=(
            "the targets' sha256, checked by "
            "`tests/adaptations/test_records_on_cpu.py::"
            "test_every_target_is_the_code_its_record_was_written_against`; "
            "`tests/agent_loop/test_parity_on_cpu.py` checks every output field `tool_agent` sets, "
            "`routed_experts` included, equals mm_tool's"
        ),
    ),
    Adaptation(
        row=18,
        section=Section.EXTENSIONS,
        where=(
            "`step_hook/manager.py`: `MMToolAgentLoopManager(AgentLoopManager)`, the classic trainer's step"
            " hook "
            "(`+actor_rollout_ref.rollout.agent.agent_loop_manager_class=verl_mm_tools.step_hook.manager.MMToolAgentLoopManager`)"
            "; its target checked when it is built (`guard.confirm`)"
        ),
        targets=(
            Target(
                "verl.experimental.agent_loop.agent_loop",
                "AgentLoopManager.generate_sequences",
                "cbbd9a639567f4636fd4d9a04cd8e13f629206f9615aed90b5bab5f4aa50ef31",
            ),
        ),
        what=(
            "runs `step.process_step` on every generated batch; calls verl's "
            "`generate_sequences.__wrapped__` (under verl's `auto_await`)"
        ),
        why=("the classic trainer's only channel from rollout to the logger is the manager's `meta_info[\"timing\"]`"),
        applies_to="verl 0.9.1 classic trainer (`trainer.use_v1=false`, deprecated by verl)",
        proof="none (an extension, not a fix)",
    ),
    Adaptation(
        row=19,
        section=Section.EXTENSIONS,
        where=(
            "`step_hook/replay_buffer.py`: `MMToolReplayBuffer(ReplayBuffer)` / `MMToolReplayBufferAsync`, "
            "the v1 trainer's step hook (`trainer.v1.sampler.custom_sampler`); its target checked when it is built "
            "(`guard.confirm`)"
        ),
        targets=(
            Target(
                "verl.trainer.ppo.v1.replay_buffer",
                "ReplayBuffer.sample",
                "cdcecebeb7f0b44e9726b62e208fb6821023591d8b91b0a9ad56750a96363e43",
            ),
        ),
        what=(
            "samples as verl's buffer does, then returns the step metrics and writes per-turn rewards to "
            "`rm_scores`; polls every 0.1 s"
        ),
        why=("the returned metrics dict is the v1 trainer's only channel to the logger; verl's buffer polls every 2 s"),
        applies_to="verl 0.9.1 v1 trainer",
        proof="none (an extension)",
    ),
    Adaptation(
        row=20,
        section=Section.EXTENSIONS,
        where=(
            "`cpu/platform.py` `PlatformCPU`, `cpu/replica.py` `HFReplica` / `HFServerAdapter`, "
            "`cpu/server.py` `HFRolloutServer`, `cpu/checkpoint_engine.py` `CPUObjectStoreCheckpointEngine`"
        ),
        what=(
            "the CPU backend: a platform (device `cpu`, gloo, a device module with no-op CUDA calls, Ray "
            "resource `GPU`), the `hf` rollout, the `cpu_object_store` checkpoint engine"
        ),
        why="verl 0.9.1 has no CPU platform nor a rollout or checkpoint engine that runs without GPUs",
        applies_to="verl 0.9.1",
        proof="none (extensions); tested in `tests/cpu/`",
    ),
    Adaptation(
        row=21,
        section=Section.EXTENSIONS,
        where=(
            "`runtime/workers.py`: `per_sample_worker_class()` (a subclass of verl's classic `AgentLoopWorker`); its "
            "targets checked when it builds the class (`guard.confirm`)"
        ),
        targets=(
            Target(
                "verl.experimental.agent_loop.agent_loop",
                "AgentLoopWorker._agent_loop_postprocess",
                "0673c29ea3dbbbecc8b42274244afb73f7befd9d6d605654eaf4c149b4259bf6",
            ),
            Target(
                "verl.experimental.agent_loop.agent_loop",
                "AgentLoopWorker._postprocess",
                "d55eabeea2dc52a69666bfccaeee1c2c381d732ee8cd183e57cd6744733f12bf",
            ),
        ),
        what="postprocesses each of a loop's several samples into its own row, as the v1 worker does",
        why=("the in-process test and bench harness runs the classic worker, which takes one output per trajectory"),
        applies_to="verl 0.9.1",
        proof="none (test harness)",
    ),
    Adaptation(
        row=22,
        section=Section.CONFIGURATION,
        where=(
            "`cpu/overrides.py`: `CPU_TRAINER_OVERRIDES`, `V1_OVERRIDES`, `SEPARATE_ASYNC_OVERRIDES`; "
            "`cpu/vllm_cpu.py`: `VLLM_ROLLOUT_OVERRIDES`"
        ),
        what=(
            "the hydra overrides a CPU run needs, each with its reason in the code (e.g. "
            "`ray_init.num_gpus=1`: verl's resource pools are hard-coded `use_gpu=True`; "
            "`SimpleStorage.num_data_storage_units=1`: TransferQueue's 8 default storage actors are never "
            "placed)"
        ),
        why="verl's defaults assume GPUs and several nodes",
        applies_to="verl 0.9.1",
        proof="none; the overrides compose with verl's own config: `tests/demo/test_demo_on_cpu.py`",
    ),
    Adaptation(
        row=23,
        section=Section.CONFIGURATION,
        where="`setup.py`: `cachetools`, `fastapi`, `uvicorn`, `mathruler`, `psutil`, `TransferQueue`",
        what=(
            "declares what verl's code imports without declaring it (TransferQueue only in verl's `verl-core` extra)"
        ),
        why="a plain `pip install verl==0.9.1` cannot run its agent loops, reward scoring or v1 trainer",
        applies_to="verl 0.9.1",
        proof=(
            "`tests/test_packaging_on_cpu.py::test_verl_still_leaves_out_what_its_code_imports_and_we_declare_it`"
            " (added with this inventory)"
        ),
    ),
    Adaptation(
        row=35,
        section=Section.CONFIGURATION,
        where="`cpu/sft.py`: `CPU_SFT_OVERRIDES`, `sft_overrides`, `run_verl_sft`",
        what=(
            "the hydra overrides and launch of `verl.trainer.sft_trainer` on CPU, each override with its "
            "reason (e.g. `engine.strategy=fsdp2`: FSDP1 refuses CPU parameters with `sync_module_states`; "
            "`model.use_remove_padding=false`: verl's packed attention needs flash-attention; "
            "`data.enable_thinking_default=null`: verl's default is the string `'none'`, which the dataset "
            "reads as `enable_thinking=True`); torchrun with `cpu_environment()`; enough "
            "`trainer.total_epochs` to reach the steps"
        ),
        why=(
            "verl's SFT defaults assume GPUs (bf16, FSDP1, flash-attention, wandb, 8 dataloader workers), "
            "and it saves only at the last step, which `total_epochs` (default 4) may stop short of"
        ),
        applies_to="verl 0.9.1",
        proof="none; the overrides compose with verl's config and train: `tests/cpu/test_verl_sft_on_cpu.py`",
    ),
)

FULLY_ASYNC_MODULE = "verl.experimental.fully_async_policy.fully_async_main"
TOUCHPOINTS = (
    *TOUCHPOINTS,
    Adaptation(
        row=37,
        section=Section.EXTENSIONS,
        where=(
            "`step_hook/fully_async.py`: `MMToolFullyAsyncTrainer(FullyAsyncTrainer)`, "
            "`MMToolFullyAsyncTaskRunner(FullyAsyncTaskRunner)` and `main`, the fully async trainer's step hook "
            "(`python -m verl_mm_tools.step_hook.fully_async`); its targets checked when it starts (`guard.confirm`)"
        ),
        targets=(
            Target(
                "verl.experimental.fully_async_policy.fully_async_trainer",
                "FullyAsyncTrainer.__ray_actor_class__._fit_generate",
                "d118db6cb8d5af80c4350c80cb4c3487d80a3e02d596f5254808167d43f04653",
            ),
            Target(
                FULLY_ASYNC_MODULE,
                "FullyAsyncTaskRunner.__ray_actor_class__._create_trainer",
                "5068b54486dfcbaaf26a7c6713c0d01059b3c7b23e283464d430ec82bc9ea765",
            ),
            Target(FULLY_ASYNC_MODULE, "main", "484e81c5352d0dfdeed8d54d53308d4a38f242effd037e1608ebf0f9893675f0"),
        ),
        what=(
            "runs `step.process_step` on each batch the trainer takes from the rollouter's queue (after verl's "
            "`_fit_generate`; metrics into the step's `self.metrics`); copies the task runner's `_create_trainer` "
            "and verl's `main` to create that trainer and mark the config (`async_training.step_hook`)"
        ),
        why=(
            "verl's fully async rollouter builds verl's agent-loop manager whatever the config names and its "
            "trainer takes no custom sampler: no hook point is configurable"
        ),
        applies_to="verl 0.9.1 fully async trainer (`verl.experimental.fully_async_policy`)",
        proof="none (an extension); it runs in `tests/demo/test_fully_async_on_cpu.py`",
    ),
    Adaptation(
        row=41,
        section=Section.EXTENSIONS,
        where=(
            "`agent_loop/resumes.py`: `ResumeRecordingClient(FullyAsyncLLMServerClient, _AttemptLog)` and "
            "`recording_view`, used by the mm_tool loop's engine (`agent_loop/engine.py`) when verl hands it the "
            "resuming client; its target checked there (`guard.confirm`)"
        ),
        targets=(
            Target(
                "verl.workers.rollout.llm_server",
                "FullyAsyncLLMServerClient.generate",
                "3d6399350ff024fd974ac921bc42f8a061ad81adaca593db1de2265cba43f6b0",
            ),
        ),
        what=(
            "puts a class between verl's resuming client and its base, so each attempt of the resume loop (one "
            "`super().generate` per abort) is recorded: the prompt tokens sent, vLLM's prefix-cache hits for it, the "
            "images sent; a view sharing the client's `__dict__`, verl's object untouched"
        ),
        why=(
            "verl's client returns one reply for all of a generation's attempts and keeps only the first attempt's "
            "`num_cached_tokens`: what a resume costs the engine (a whole prefill and every image's encoding "
            "again, since the sync reset vLLM's caches) is not visible otherwise"
        ),
        applies_to="verl 0.9.1 (`verl.workers.rollout.llm_server`)",
        proof=(
            "none (an observation); exact against a scripted server: "
            "`tests/agent_loop/test_partial_rollout_on_cpu.py::"
            "test_a_resumed_trajectory_equals_the_uninterrupted_one_but_for_its_weight_versions`"
        ),
    ),
)

_BY_ROW = {adaptation.row: adaptation for adaptation in TOUCHPOINTS}
# The rows whose code subclasses or copies verl's, for ``guard.confirm`` where that code is used.
LOOP_COPIES = _BY_ROW[17]  # agent_loop/mm_tool_loop.py: MMToolAgentLoop
CLASSIC_MANAGER = _BY_ROW[18]  # step_hook/manager.py: MMToolAgentLoopManager
V1_REPLAY_BUFFER = _BY_ROW[19]  # step_hook/replay_buffer.py: MMToolReplayBuffer
PER_SAMPLE_WORKER = _BY_ROW[21]  # runtime/workers.py: per_sample_worker_class
FULLY_ASYNC_TRAINER = _BY_ROW[37]  # step_hook/fully_async.py: MMToolFullyAsyncTrainer, its task runner and main
RESUME_RECORDING = _BY_ROW[41]  # agent_loop/resumes.py: ResumeRecordingClient
