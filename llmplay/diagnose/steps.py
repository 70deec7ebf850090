"""The §7 step catalogue the findings suggest from, in the order the checklist ranks steps by cost-effectiveness.

Each entry is a sentence for people and, where an engine knob can carry it out, the typed remedy the tuner reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmplay.archive.model import Candidate
from llmplay.engines.knobs import Direction, Remedy


@dataclass(frozen=True)
class CatalogueStep:
    """One §7 step: its sentence and, where an engine knob implements it, the remedy and its direction (None: a
    change to the client or the load, e.g. a sensible max_tokens, which no engine knob makes)."""

    text: str
    remedy: Remedy | None = None
    direction: Direction = Direction.RAISE


@dataclass(frozen=True)
class Suggestion:
    """The steps a finding suggests, cheapest first."""

    steps: tuple[CatalogueStep, ...] = ()

    @property
    def text(self) -> str:
        return "; then ".join(s.text for s in self.steps)

    def candidates(self, finding_id: str, evidence: str) -> tuple[Candidate, ...]:
        return tuple(Candidate(s.remedy, s.direction, finding_id, evidence) for s in self.steps if s.remedy is not None)


S_CONT_BATCH = CatalogueStep("turn continuous batching on (§7.1)", Remedy.CONTINUOUS_BATCHING, Direction.ENABLE)
S_PREFIX = CatalogueStep(
    "prefix caching for shared system prompts / multi-turn (§7.2)", Remedy.PREFIX_CACHING, Direction.ENABLE
)
S_MAX_TOKENS = CatalogueStep("streaming and a sensible max_tokens (§7.3)")
S_WEIGHT_QUANT = CatalogueStep(
    "FP8/INT8/AWQ/GPTQ weights (halves the bytes per step)", Remedy.WEIGHT_QUANTIZATION, Direction.QUANTIZE
)
S_KV_QUANT = CatalogueStep("KV-cache quantization (8/4 bit)", Remedy.KV_DTYPE, Direction.QUANTIZE)
S_BATCH = CatalogueStep(
    "raise max batch / max concurrent sequences (max_num_seqs, llama.cpp --parallel) matched to the load",
    Remedy.MAX_BATCH,
    Direction.RAISE,
)
S_SEQ = CatalogueStep("max-seq-len matched to the load", Remedy.CONTEXT_LENGTH, Direction.LOWER)
S_KERNELS = CatalogueStep(
    "CUDA graphs, FlashAttention, kernel fusion (engine choice and version)", Remedy.CUDA_GRAPHS, Direction.ENABLE
)
S_GPU_MEM = CatalogueStep(
    "give the KV cache more memory (e.g. vLLM gpu_memory_utilization)", Remedy.KV_MEMORY, Direction.RAISE
)
S_LOWER_CONC = CatalogueStep(
    "cap concurrency (max_num_seqs) below the point where the KV cache runs out",
    Remedy.CONCURRENCY_CAP,
    Direction.LOWER,
)
S_SCALE = CatalogueStep(
    "scale out: more replicas behind a load balancer, or tensor parallelism / a bigger GPU",
    Remedy.SCALE_OUT,
    Direction.RAISE,
)

CATALOGUE: tuple[CatalogueStep, ...] = (
    S_CONT_BATCH,
    S_PREFIX,
    S_MAX_TOKENS,
    S_BATCH,
    S_SEQ,
    S_KERNELS,
    S_GPU_MEM,
    S_LOWER_CONC,
    S_KV_QUANT,
    S_WEIGHT_QUANT,
    S_SCALE,
)


def steps(*catalogue_steps: CatalogueStep) -> Suggestion:
    """Steps to try, cheapest first, as one suggestion."""
    return Suggestion(tuple(catalogue_steps))
