"""Hand-written Triton kernels for ignis, each with a PyTorch reference of the same signature.

The reference is both the CPU path and the oracle of the tests. This package imports
nothing of ignis. Public ops:

  write_kv(key, value, k_cache, v_cache, slot_mapping, backend=None)
  paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
                  scale=None, sliding_window=None, out=None, backend=None,
                  *, max_query_len=None, max_seq_len=None, num_splits=None, softcap=None, sinks=None)
         -- sinks: gpt-oss's learned per-head softmax sink logits (fp32 [num_q_heads])
  sample(logits, params: SamplingTensors, return_logprobs=False, inplace_penalties=False,
         backend=None)  -- see ignis_kernels.sampling
  apply_token_bitmask_(logits, bitmask, rows, floor=-1e30, backend=None)
         -- packed per-row token masks (grammars) applied in place (see ignis_kernels.token_mask)
  BatchedCpuAttention(block_tables, query_start_loc, seq_lens, *, num_decodes, ...)
         -- paged attention on the CPU with all decode rows in one SDPA per layer
         (see ignis_kernels.attention_cpu; the engine's CPU path)
  cpu_native.load() -> bool
         -- builds and registers torch.ops.ignis_cpu.decode_layers (ignis_kernels/cpu/decode.cpp):
         a whole decode step of an int4/int8 CPU model in one call

  cpu_platform.current() -> CpuPlatform
         -- what this CPU and torch build run (tier, GEMMs, native flags); IGNIS_CPU_CAPS
         caps it, applied here on import, before torch's first op

backend: None (the process default, see set_backend), "auto", "triton" or "torch".
"""

from ignis_kernels import cpu_platform

cpu_platform.apply_cap()  # before any kernel module runs a torch op


from ignis_kernels.attention import paged_attention  # noqa: E402
from ignis_kernels.attention_cpu import BatchedCpuAttention  # noqa: E402
from ignis_kernels.attention_ref import paged_attention_ref  # noqa: E402
from ignis_kernels.backend import Backend, get_backend, set_backend  # noqa: E402
from ignis_kernels.kv_cache import write_kv  # noqa: E402
from ignis_kernels.kv_cache_ref import write_kv_ref  # noqa: E402
from ignis_kernels.sampling import SamplingTensors, sample, sample_ref  # noqa: E402
from ignis_kernels.token_mask import apply_token_bitmask_, apply_token_bitmask_ref_  # noqa: E402

__all__ = [
    "Backend",
    "BatchedCpuAttention",
    "get_backend",
    "paged_attention",
    "paged_attention_ref",
    "set_backend",
    "write_kv",
    "write_kv_ref",
    "SamplingTensors",
    "sample",
    "sample_ref",
    "apply_token_bitmask_",
    "apply_token_bitmask_ref_",
]
