"""Datasheet figures of common GPUs, keyed by the name NVML reports: the roofline's denominators."""

from __future__ import annotations

import re
from dataclasses import dataclass

GiB = 2**30


@dataclass(frozen=True)
class GpuSpec:
    model: str  # canonical name, e.g. "H100 SXM"
    memory_bandwidth_bytes_s: float  # datasheet peak HBM/GDDR bandwidth
    bf16_dense_flops: float  # dense (no sparsity) tensor-core bf16/fp16 FLOP/s
    memory_bytes: int  # nominal memory; prefer NVML's measured total when available


# Ordered: the first pattern that matches wins, so specific variants come before their family
# (H100 PCIe before H100; L40S before L40 before L4). Patterns run on the lower-cased NVML name
# ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA GeForce RTX 4090", "Tesla T4").
_TABLE: tuple[tuple[str, GpuSpec], ...] = (
    (r"\bgb200\b", GpuSpec("GB200", 8.0e12, 2.5e15, 186 * GiB)),
    (r"\bb200\b", GpuSpec("B200", 8.0e12, 2.25e15, 180 * GiB)),
    (r"\bgh200\b", GpuSpec("GH200", 4.0e12, 989e12, 96 * GiB)),
    (r"\bh200\b.*\bnvl\b", GpuSpec("H200 NVL", 4.8e12, 835e12, 141 * GiB)),
    (r"\bh200\b", GpuSpec("H200", 4.8e12, 989e12, 141 * GiB)),
    (r"\bh100\b.*\bpcie\b", GpuSpec("H100 PCIe", 2.0e12, 756e12, 80 * GiB)),
    (r"\bh100\b.*\bnvl\b", GpuSpec("H100 NVL", 3.9e12, 835e12, 94 * GiB)),
    (r"\bh100\b", GpuSpec("H100 SXM", 3.35e12, 989e12, 80 * GiB)),
    (r"\bh800\b", GpuSpec("H800 SXM", 3.35e12, 989e12, 80 * GiB)),
    (r"\ba100\b.*80gb.*pcie|\ba100\b.*pcie.*80gb", GpuSpec("A100 80GB PCIe", 1.935e12, 312e12, 80 * GiB)),
    (r"\ba100\b.*80gb", GpuSpec("A100 80GB SXM", 2.039e12, 312e12, 80 * GiB)),
    (r"\ba100\b", GpuSpec("A100 40GB", 1.555e12, 312e12, 40 * GiB)),
    (r"\ba800\b", GpuSpec("A800 80GB", 2.039e12, 312e12, 80 * GiB)),
    (r"\bl40s\b", GpuSpec("L40S", 0.864e12, 362e12, 48 * GiB)),
    (r"\bl40\b", GpuSpec("L40", 0.864e12, 181e12, 48 * GiB)),
    (r"\bl4\b", GpuSpec("L4", 0.3e12, 121e12, 24 * GiB)),
    (r"\ba10g\b", GpuSpec("A10G", 0.6e12, 70e12, 24 * GiB)),
    (r"\ba10\b", GpuSpec("A10", 0.6e12, 125e12, 24 * GiB)),
    (r"\ba40\b", GpuSpec("A40", 0.696e12, 150e12, 48 * GiB)),
    (r"rtx 6000 ada", GpuSpec("RTX 6000 Ada", 0.96e12, 364e12, 48 * GiB)),
    # GeForce: datasheet fp16 tensor rate with fp16 accumulate; bf16 with fp32 accumulate is half
    (r"rtx 5090", GpuSpec("RTX 5090", 1.792e12, 209e12, 32 * GiB)),
    (r"rtx 4090", GpuSpec("RTX 4090", 1.008e12, 165e12, 24 * GiB)),
    (r"rtx 3090", GpuSpec("RTX 3090", 0.936e12, 71e12, 24 * GiB)),
    (r"\bt4\b", GpuSpec("T4", 0.32e12, 65e12, 16 * GiB)),
    (r"\bv100\b.*32gb", GpuSpec("V100 32GB", 0.9e12, 125e12, 32 * GiB)),
    (r"\bv100\b", GpuSpec("V100 16GB", 0.9e12, 125e12, 16 * GiB)),
)
_COMPILED = tuple((re.compile(p), spec) for p, spec in _TABLE)


def lookup_gpu(name: str) -> GpuSpec | None:
    """The spec for an NVML device name, or None for a GPU not in the table (the report then says so)."""
    n = re.sub(r"[-_]", " ", name.lower())
    for pattern, spec in _COMPILED:
        if pattern.search(n):
            return spec
    return None


def known_models() -> list[str]:
    return [spec.model for _, spec in _TABLE]
