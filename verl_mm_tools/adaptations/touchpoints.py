"""The rows of the inventory that replace no code of verl's and have no one module of their own: how the plugin loads
and registers, extension points used in several places, configuration and packaging workarounds. A subclass or a copy
of verl's code declares its row where it is (the module's ``ADAPTATION``, checked there by ``guard.confirm``: a
changed target refuses to start, as every other row's does). Imports nothing of verl."""

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
