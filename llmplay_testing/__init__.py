"""Test helpers shared by tests/ and benchmarks/: instrument and fault servers, fake NVML, archive maker, CPU-run helpers."""
