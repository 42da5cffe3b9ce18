"""verl-mm-tools: multimodal multi-turn tool use for verl, as a plugin."""

from verl_mm_tools.adaptations.import_order import import_first

__version__ = "0.1.0"

# Modules that never import verl: what the CLI needs to parse its arguments, the pure image ops, the trajectory
# record and the viewer (tests/test_cli_on_cpu.py and tests/test_layers_on_cpu.py check it).
LIGHT_MODULES = frozenset(
    {
        "verl_mm_tools.adaptations",  # the package, and the adaptations that must load without verl
        "verl_mm_tools.adaptations.import_order",  # the import hooks themselves
        "verl_mm_tools.adaptations.guard",  # the one guard and failure policy
        "verl_mm_tools.adaptations.inventory",  # renders the records (it imports the registry only when asked)
        "verl_mm_tools.adaptations.record",  # the records every adaptation declares
        "verl_mm_tools.adaptations.vllm_plugin",  # vLLM loads this plugin in every engine process
        "verl_mm_tools.adaptations.vllm_plugin.eager_sampler",
        "verl_mm_tools.adaptations.vllm_plugin.linear_weights",
        "verl_mm_tools.adaptations.vllm_plugin.moe_silu",
        "verl_mm_tools.adaptations.vllm_plugin.moe_weights",
        "verl_mm_tools.agent_loop",  # the package (its loop class is imported on first use) and the option values
        "verl_mm_tools.agent_loop.options",
        "verl_mm_tools.bench",  # the package, and the op timings that run in a process loading nothing else
        "verl_mm_tools.bench.figures",
        "verl_mm_tools.bench.opencv_ops",
        "verl_mm_tools.bench.ops",
        "verl_mm_tools.check_report",
        "verl_mm_tools.cli",
        "verl_mm_tools.cli_types",
        "verl_mm_tools.compact_image",  # the compact image form (pure: the processor is passed in)
        "verl_mm_tools.cpu",  # the package and its vLLM settings, which the vLLM plugin reads in every engine process
        "verl_mm_tools.cpu.names",  # the HF rollout's name (the demo's options read it)
        "verl_mm_tools.cpu.vllm_cpu",
        "verl_mm_tools.cpu.weight_mailbox",  # the weight-sync mailbox actor, started in a fresh Ray worker
        "verl_mm_tools.data",
        "verl_mm_tools.data.command",
        "verl_mm_tools.errors",
        "verl_mm_tools.evaluate",
        "verl_mm_tools.evaluate.command",
        "verl_mm_tools.families",  # the model families' records (the CLI's --family choices)
        "verl_mm_tools.families.catalog",
        "verl_mm_tools.families.docs",
        "verl_mm_tools.families.record",
        "verl_mm_tools.families.towers",
        "verl_mm_tools.families.vocabularies",
        "verl_mm_tools.files",
        "verl_mm_tools.handoff",  # what the loop hands the trainer (the record reads its keys)
        "verl_mm_tools.ops",
        "verl_mm_tools.ops.argument_checks",
        "verl_mm_tools.ops.draw",
        "verl_mm_tools.ops.geometry",
        "verl_mm_tools.ops.text",
        "verl_mm_tools.ops.transform",
        "verl_mm_tools.parsers",  # pure readers of model output (Gemma 4's tool-call arguments)
        "verl_mm_tools.parsers.gemma4",
        "verl_mm_tools.record",
        "verl_mm_tools.sandbox",  # the python tool's sandbox (its kernel script runs where verl is not even bound)
        "verl_mm_tools.sandbox.bwrap",
        "verl_mm_tools.sandbox.kernel",
        "verl_mm_tools.sandbox.limits",
        "verl_mm_tools.sandbox.session",
        "verl_mm_tools.step_metrics",  # the step metrics (pure: they read the hand-off)
        "verl_mm_tools.tiny",
        "verl_mm_tools.tiny.builder",
        "verl_mm_tools.tiny.corpus",
        "verl_mm_tools.tiny.model",
        "verl_mm_tools.tiny.processor",
        "verl_mm_tools.tiny.spec",
        "verl_mm_tools.tiny.tokenizer",
        "verl_mm_tools.trajectories",  # the package, the commands' arguments and the record reader
        "verl_mm_tools.trajectories.command",
        "verl_mm_tools.trajectories.read",
        "verl_mm_tools.trajectories.record_checks",
        "verl_mm_tools.trajectories.rescore_command",
        "verl_mm_tools.trajectories.rescore_options",
        "verl_mm_tools.verl_registry",
        "verl_mm_tools.viewer",
        "verl_mm_tools.viewer.chromium",
        "verl_mm_tools.viewer.command",
        "verl_mm_tools.viewer.curve",
        "verl_mm_tools.viewer.html",
        "verl_mm_tools.viewer.loading",
        "verl_mm_tools.viewer.site",
        "verl_mm_tools.workspace",
    }
)

# Every other module of ours is run after verl has been imported (and has loaded our plugin): see
# adaptations/import_order.py.
import_first("verl", "verl_mm_tools", LIGHT_MODULES)
