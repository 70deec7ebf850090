"""Size budgets that keep a stage to its one job: tuning/ orchestrates (issue 37); what it decides with, records or
sends lives in stats/, archive/ and loadgen/."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "llmplay"
TUNING_MAX_LINES = 4000


def test_tuning_holds_orchestration_only_under_its_line_budget():
    sizes = {
        p.relative_to(PACKAGE).as_posix(): len(p.read_text().splitlines()) for p in (PACKAGE / "tuning").rglob("*.py")
    }
    total = sum(sizes.values())
    biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total < TUNING_MAX_LINES, (
        f"llmplay/tuning/ has {total} lines (budget {TUNING_MAX_LINES}); largest: {biggest}"
    )
