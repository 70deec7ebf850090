"""Check on a real GPU that llmplay's NVML telemetry reads true numbers under a known load.

Runs the NVML sampler while the GPU (1) idles, (2) runs a large bf16 matmul loop and (3) runs a
device-to-device copy loop, measures TFLOP/s and copy bandwidth with CUDA events, and prints NVML
utilization, memory peak and GPM DRAM-bandwidth utilization next to measured ÷ datasheet figures,
so their plausibility is visible. The measured copy bandwidth is the roofline's realistic denominator.

    python benchmarks/gpu_check.py            # ~30 s; writes $OUT/gpu_check.json when OUT is set
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from llmplay.diagnose.gpus import lookup_gpu
from llmplay.telemetry.nvml import NvmlSource
from llmplay.telemetry.sampler import TelemetrySampler

GiB = 2**30
PYNVML_HELP = (
    "gpu_check: pynvml is not installed, so NVML telemetry cannot be checked.\n"
    "  install it:        python -m pip install nvidia-ml-py\n"
    "  or, offline:       python -m pip install --no-index --find-links <dir with nvidia_ml_py-*.whl> nvidia-ml-py\n"
    "  continuing with the PyTorch measurements only."
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=10.0, help="duration of each load phase (default 10)")
    ap.add_argument("--idle-seconds", type=float, default=2.0, help="idle baseline phase (default 2)")
    ap.add_argument("--matmul-n", type=int, default=8192, help="square bf16 matmul size (default 8192)")
    ap.add_argument("--copy-gib", type=float, default=4.0, help="bytes per copy, GiB (default 4)")
    ap.add_argument("--interval", type=float, default=0.2, help="NVML sampling interval, s (default 0.2)")
    ap.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    ap.add_argument("--json", default=None, help="result file (default $OUT/gpu_check.json when OUT is set)")
    return ap.parse_args(argv)


def require_cuda() -> Any:
    try:
        import torch  # deferred: heavy, and only the GPU machine has it
    except ImportError:
        raise SystemExit("gpu_check: PyTorch is not installed; run this on the GPU machine, which has it") from None
    if not torch.cuda.is_available():
        raise SystemExit(
            "gpu_check: CUDA is not available (torch.cuda.is_available() is False); "
            "run this on a machine with an NVIDIA GPU and driver"
        )
    return torch


def nvml_index_for(torch: Any, device: int) -> tuple[int, str | None]:
    """NVML and CUDA may number GPUs differently (CUDA_VISIBLE_DEVICES, PCI order): match by UUID."""
    try:
        import pynvml  # deferred: the script still measures with PyTorch alone where NVML is not installed
    except ImportError:
        return device, None
    try:
        want = str(torch.cuda.get_device_properties(device).uuid)
        pynvml.nvmlInit()
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                u = u.decode() if isinstance(u, bytes) else str(u)
                if u.removeprefix("GPU-") == want.removeprefix("GPU-"):
                    return i, u
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # fall back to the CUDA ordinal; said in the output
        print(f"gpu_check: could not match CUDA device to NVML by UUID ({e}); assuming NVML index {device}")
    return device, None


def timed_loop(torch: Any, seconds: float, body: Callable[[], None], batch: int) -> tuple[int, float]:
    """Run `body` in batches until `seconds` of wall time pass; return (iterations, GPU seconds by CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 0
    gpu_ms = 0.0
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        start.record()
        for _ in range(batch):
            body()
        end.record()
        end.synchronize()
        gpu_ms += start.elapsed_time(end)
        iters += batch
    return iters, gpu_ms / 1000.0


def phase(
    name: str, nvml_index: int, interval: float, run: Callable[[], dict[str, float]], skip_s: float
) -> dict[str, Any]:
    """One load under the sampler; telemetry is summarised after `skip_s` so ramp-up does not dilute it."""
    with TelemetrySampler([NvmlSource([nvml_index])], interval_s=interval) as s:
        measured = run()
    series = s.result()
    return {
        "name": name,
        "measured": measured,
        "telemetry": series.summary(start_s=min(skip_s, series.duration_s / 2)),
        "samples": len(series.samples),
        "notes": list(series.notes),
        "info": dict(series.info),
        "duration_s": series.duration_s,
    }


def fmt(x: float | None, scale: float = 1.0, unit: str = "", digits: int = 1) -> str:
    return "not measured" if x is None else f"{x * scale:.{digits}f}{unit}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch = require_cuda()
    have_nvml = importlib.util.find_spec("pynvml") is not None
    if not have_nvml:
        print(PYNVML_HELP)
    dev = args.device
    torch.cuda.set_device(dev)
    props = torch.cuda.get_device_properties(dev)
    nvml_index, uuid = nvml_index_for(torch, dev)
    spec = lookup_gpu(props.name)
    print(
        f"GPU {dev}: {props.name} ({props.total_memory / GiB:.1f} GiB), NVML index {nvml_index}, "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    )
    print(f"datasheet: {spec}" if spec else "datasheet: GPU not in llmplay.gpus table; ratios not shown")

    n = args.matmul_n
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    nbytes = int(args.copy_gib * GiB)
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):  # cuBLAS handle and kernel selection happen outside the timed loops
        torch.matmul(a, b, out=c)
        dst.copy_(src)
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated(dev)

    def idle() -> dict[str, float]:
        time.sleep(args.idle_seconds)
        return {}

    def matmul() -> dict[str, float]:
        iters, gpu_s = timed_loop(torch, args.seconds, lambda: torch.matmul(a, b, out=c), batch=20)
        return {"iterations": iters, "gpu_s": gpu_s, "flops_s": 2.0 * n**3 * iters / gpu_s}

    def copy() -> dict[str, float]:
        iters, gpu_s = timed_loop(torch, args.seconds, lambda: dst.copy_(src), batch=10)
        return {"iterations": iters, "gpu_s": gpu_s, "bandwidth_bytes_s": 2.0 * nbytes * iters / gpu_s}  # read + write

    skip = 1.0
    phases = [
        phase("idle", nvml_index, args.interval, idle, 0.5),
        phase("bf16 matmul", nvml_index, args.interval, matmul, skip),
        phase("d2d copy", nvml_index, args.interval, copy, skip),
    ]
    idle_p, mm, cp = phases
    flops = mm["measured"]["flops_s"]
    bw = cp["measured"]["bandwidth_bytes_s"]

    print()
    head = (
        f"{'phase':<12} {'measured':>16} {'÷ datasheet':>12} {'NVML util':>10} {'mem-ctl util':>12} "
        f"{'SM act (GPM)':>13} {'DRAM bw (GPM)':>14} {'mem peak':>11} {'power':>8} {'SM clock':>9}"
    )
    print(head)
    print("-" * len(head))
    for p, meas, ratio in (
        (idle_p, "-", None),
        (mm, f"{flops / 1e12:.0f} TFLOP/s", flops / spec.bf16_dense_flops if spec else None),
        (cp, f"{bw / 1e12:.2f} TB/s", bw / spec.memory_bandwidth_bytes_s if spec else None),
    ):
        t = p["telemetry"]
        print(
            f"{p['name']:<12} {meas:>16} {fmt(ratio, 100, '%'):>12} {fmt(t.get('gpu.util_mean'), 100, '%'):>10} "
            f"{fmt(t.get('gpu.mem_bw_util_mean'), 100, '%'):>12} {fmt(t.get('gpu.sm_activity_mean'), 100, '%'):>13} "
            f"{fmt(t.get('gpu.dram_bw_util_mean'), 100, '%'):>14} "
            f"{fmt(t.get('memory.peak_bytes'), 1 / GiB, ' GiB'):>11} {fmt(t.get('gpu.power_w_mean'), 1, ' W', 0):>8} "
            f"{fmt(t.get('gpu.sm_clock_mhz_mean'), 1, ' MHz', 0):>9}"
        )
    for p in phases:
        for note in p["notes"]:
            print(f"  note ({p['name']}): {note}")

    # plausibility: each check says what was expected, what was seen; a check whose input is absent is skipped
    checks: list[dict[str, Any]] = []

    def check(name: str, ok: bool | None, seen: str) -> None:
        checks.append({"check": name, "ok": ok, "seen": seen})

    tm, tc, ti = mm["telemetry"], cp["telemetry"], idle_p["telemetry"]
    if have_nvml and tm:
        check(
            "NVML util ≥ 90% during matmul", tm.get("gpu.util_mean", 0) >= 0.9, fmt(tm.get("gpu.util_mean"), 100, "%")
        )
        check("NVML util ≤ 10% at idle", ti.get("gpu.util_mean", 1) <= 0.1, fmt(ti.get("gpu.util_mean"), 100, "%"))
        peak = tm.get("memory.peak_bytes")
        check(
            "NVML memory peak ≥ PyTorch allocation",
            peak is not None and peak >= allocated,
            f"{fmt(peak, 1 / GiB, ' GiB', 2)} vs {allocated / GiB:.2f} GiB allocated",
        )
        if "gpu.sm_activity_mean" in tm:
            check(
                "GPM SM activity ≥ 80% during matmul",
                tm["gpu.sm_activity_mean"] >= 0.8,
                fmt(tm["gpu.sm_activity_mean"], 100, "%"),
            )
        if "gpu.dram_bw_util_mean" in tc and spec:
            expect = bw / spec.memory_bandwidth_bytes_s
            got = tc["gpu.dram_bw_util_mean"]
            check(
                "GPM DRAM bw util within ±20 points of measured ÷ datasheet",
                abs(got - expect) <= 0.2,
                f"GPM {got * 100:.1f}% vs measured {expect * 100:.1f}%",
            )
        check(
            "NVML memory-controller util higher in copy than idle",
            tc.get("gpu.mem_bw_util_mean", 0) > ti.get("gpu.mem_bw_util_mean", 1),
            f"{fmt(tc.get('gpu.mem_bw_util_mean'), 100, '%')} vs {fmt(ti.get('gpu.mem_bw_util_mean'), 100, '%')}",
        )
    if spec:
        check(
            "copy bandwidth 50–100% of datasheet",
            0.5 <= bw / spec.memory_bandwidth_bytes_s <= 1.0,
            f"{bw / spec.memory_bandwidth_bytes_s * 100:.1f}%",
        )
        check(
            "matmul 30–100% of datasheet dense bf16",
            0.3 <= flops / spec.bf16_dense_flops <= 1.0,
            f"{flops / spec.bf16_dense_flops * 100:.1f}%",
        )
    print()
    for ch in checks:
        print(f"  [{'PASS' if ch['ok'] else 'FAIL'}] {ch['check']}: {ch['seen']}")
    print(
        f"\nroofline input: measured copy bandwidth {bw / 1e12:.3f} TB/s"
        + (
            f" = {bw / spec.memory_bandwidth_bytes_s * 100:.1f}% of the {spec.model} datasheet "
            f"{spec.memory_bandwidth_bytes_s / 1e12:.2f} TB/s"
            if spec
            else ""
        )
    )

    result = {
        "gpu": {
            "name": props.name,
            "uuid": uuid,
            "nvml_index": nvml_index,
            "total_memory_bytes": props.total_memory,
            "spec": spec.__dict__ if spec else None,
        },
        "host": platform.node(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "pynvml": have_nvml,
        "args": vars(args),
        "allocated_bytes": allocated,
        "phases": phases,
        "checks": checks,
        "roofline": {"measured_copy_bandwidth_bytes_s": bw, "measured_bf16_flops_s": flops},
    }
    out = args.json or (os.path.join(os.environ["OUT"], "gpu_check.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {out}")
    return 0 if all(ch["ok"] for ch in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
