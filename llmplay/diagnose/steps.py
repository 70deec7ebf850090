"""The §7 step catalogue the findings suggest from, in the order the checklist ranks steps by cost-effectiveness."""

from __future__ import annotations

S_CONT_BATCH = "turn continuous batching on (§7.1)"
S_PREFIX = "prefix caching for shared system prompts / multi-turn (§7.2)"
S_MAX_TOKENS = "streaming and a sensible max_tokens (§7.3)"
S_WEIGHT_QUANT = "FP8/INT8/AWQ/GPTQ weights (halves the bytes per step)"
S_KV_QUANT = "KV-cache quantization (8/4 bit)"
S_BATCH = "raise max batch / max concurrent sequences (max_num_seqs, llama.cpp --parallel) matched to the load"
S_SEQ = "max-seq-len matched to the load"
S_KERNELS = "CUDA graphs, FlashAttention, kernel fusion (engine choice and version)"
S_GPU_MEM = "give the KV cache more memory (e.g. vLLM gpu_memory_utilization)"
S_LOWER_CONC = "cap concurrency (max_num_seqs) below the point where the KV cache runs out"
S_SCALE = "scale out: more replicas behind a load balancer, or tensor parallelism / a bigger GPU"


def steps(*catalogue_steps: str) -> str:
    """Steps to try, cheapest first, as one suggestion."""
    return "; then ".join(catalogue_steps)
