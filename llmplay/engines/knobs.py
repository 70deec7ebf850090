"""The checklist's remedies (CHECKLIST §7) and each engine's map from a remedy to the knobs that implement it.

A diagnosis names a remedy ("raise the max batch"); only an adapter knows that on vLLM it is `max_num_seqs` and on
llama.cpp `parallel`, what values are sensible, what the engine does when the knob is unset, and what trying it
risks. The tuner reads these maps; nothing outside `engines/` names an engine to find a knob.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from llmplay.spec import Scalar


class Remedy(StrEnum):
    """A checklist optimization a finding can call for, in CHECKLIST §7's cost-effectiveness order."""

    CONTINUOUS_BATCHING = "continuous_batching"  # §7.1
    PREFIX_CACHING = "prefix_caching"  # §7.2
    MAX_BATCH = "max_batch"  # max-batch matched to the load
    # Before a concurrency cap: memory left unreserved costs nothing, a cap costs the load its concurrency.
    KV_MEMORY = "kv_memory"  # more memory for the KV cache
    CONCURRENCY_CAP = "concurrency_cap"  # fewer sequences than the point where the KV cache runs out
    CHUNKED_PREFILL = "chunked_prefill"  # the per-iteration prefill budget
    CONTEXT_LENGTH = "context_length"  # max-seq-len matched to the load
    CUDA_GRAPHS = "cuda_graphs"  # kernels: CUDA graphs, FlashAttention, fusion
    KV_DTYPE = "kv_dtype"  # KV-cache quantization (8/4 bit)
    WEIGHT_QUANTIZATION = "weight_quantization"  # FP8/INT8/AWQ/GPTQ weights
    SCALE_OUT = "scale_out"  # more hardware: tensor parallelism, more cores, replicas


# §7's order, cheapest first: the tuner's tie-break between remedies a bottleneck calls for equally.
CHECKLIST_ORDER: tuple[Remedy, ...] = tuple(Remedy)


class Direction(StrEnum):
    """Which way a remedy moves its knob."""

    ENABLE = "enable"  # a switch turned on
    RAISE = "raise"  # a number made larger
    LOWER = "lower"  # a number made smaller
    QUANTIZE = "quantize"  # fewer bytes per value (may change outputs)


class Risk(StrEnum):
    """What trying a knob costs besides engine time: the tuner's risk policy reads it."""

    SAFE = "safe"  # outputs unchanged; the A/B alone decides
    MEMORY = "memory"  # may run out of memory (fails the trial, which the verdict then shows)
    QUALITY = "quality"  # may change outputs: only tried where the playbook has a quality guard
    HARDWARE = "hardware"  # needs more hardware than the baseline used: only tried where the playbook allows it


@dataclass(frozen=True)
class KnobSpec:
    """One knob implementing one remedy on one engine.

    `values` are the ones worth trying, in the remedy's direction (a numeric knob's are searched, a switch's one
    value is set); `default` is what the engine uses when the knob is unset, as its `--help` of the release the
    adapter was checked against says (None: the engine chooses at start, `default_note` says how)."""

    remedy: Remedy
    knob: str  # the adapter knob (`args.<knob>` in a step)
    kind: str  # "bool" | "int" | "fraction" | "choice"
    values: tuple[Scalar, ...]
    default: Scalar
    risk: Risk = Risk.SAFE
    direction: Direction = Direction.RAISE
    default_note: str = ""
    # A precondition that, when the incumbent already meets it, makes the remedy pointless: its value is set.
    already_when: Scalar = None
    also: tuple[str, ...] = ()  # other knob names of this adapter that set the same flag (llama.cpp's max_num_seqs)

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "fraction")


def knobs_for(knob_map: tuple[KnobSpec, ...], remedy: Remedy) -> tuple[KnobSpec, ...]:
    """The knobs implementing `remedy`, in the adapter's order of preference."""
    return tuple(k for k in knob_map if k.remedy is remedy)
