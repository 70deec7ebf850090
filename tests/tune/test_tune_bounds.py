"""Bounds that show a latency goal unreachable: one request alone, and the decode roofline."""

from __future__ import annotations

from llmplay.archive.model import RooflineFacts
from llmplay.spec import Gate
from llmplay.tune.bounds import roofline_bound, unloaded_bound

TTFT_50MS = Gate("ttft.p95", "<", 0.05, "ttft.p95 < 50ms")


def test_a_ttft_gate_below_one_request_alone_is_unreachable() -> None:
    found = unloaded_bound([TTFT_50MS], {"ttft.p50": 0.062}, 12)
    assert found is not None and found.bound == "one request alone"
    assert found.message == (
        "ttft.p95 < 50ms: the limit 50 ms is below the 62 ms one request alone takes on this engine (median of 12 "
        "requests sent one at a time): no setting of the load's batching, cache or concurrency knobs reaches it"
    )


def test_gates_the_bound_cannot_speak_for_are_left_alone() -> None:
    alone = {"ttft.p50": 0.062, "tpot.p50": 0.01}
    assert unloaded_bound([TTFT_50MS], {"ttft.p50": 0.04}, 12) is None  # reachable alone
    assert unloaded_bound([Gate("ttft.p25", "<", 0.05, "ttft.p25 < 50ms")], alone, 12) is None  # below the median
    assert unloaded_bound([Gate("ttft.mean", "<", 0.05, "ttft.mean < 50ms")], alone, 12) is None
    assert unloaded_bound([Gate("throughput.output_tok_s", ">", 1e6, "x")], alone, 12) is None
    assert unloaded_bound([TTFT_50MS], {}, 12) is None  # not measured


def test_a_tpot_gate_below_the_decode_floor_is_unreachable() -> None:
    floor = RooflineFacts(floor_s=0.0042, bandwidth_source="table: H100 SXM")
    found = roofline_bound([Gate("tpot.p95", "<", 0.003, "tpot.p95 < 3ms")], floor)
    assert found is not None and found.bound == "decode roofline"
    assert found.message.startswith("tpot.p95 < 3ms: the limit 3 ms is below the decode floor of 4.2 ms per token")
    assert roofline_bound([Gate("tpot.p95", "<", 0.006, "tpot.p95 < 6ms")], floor) is None
    assert roofline_bound([Gate("tpot.p95", "<", 0.003, "x")], None) is None
