"""Strict parsing of the units a playbook may write: durations, percentages, dollars."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)$")
_PERCENT = re.compile(r"^([0-9]+(?:\.[0-9]+)?)%$")
_POINTS = re.compile(r"^([0-9]+(?:\.[0-9]+)?)pp$")
_MONEY = re.compile(r"^\$([0-9]+(?:\.[0-9]+)?)$")
_NUMBER = re.compile(r"^[+-]?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")
_SECONDS_PER = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class UnitError(ValueError):
    """`expected` says what would have been accepted; the loader adds file, line and path."""

    def __init__(self, found: object, expected: str):
        self.found, self.expected = found, expected
        super().__init__(f"found {found!r}, expected {expected}")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_duration_s(value: object, *, unit_required: bool = False) -> float:
    """'500ms' -> 0.5; a bare number is seconds unless unit_required (gates, where 500 is ambiguous)."""
    if _is_number(value) and not unit_required:
        return float(value)  # type: ignore[arg-type]
    if isinstance(value, str):
        m = _DURATION.match(value.strip())
        if m:
            return float(m.group(1)) * _SECONDS_PER[m.group(2)]
    raise UnitError(value, "a duration with a unit, like 500ms, 0.5s, 2m or 1h")


def parse_fraction(value: object) -> float:
    """'5%' -> 0.05; a bare number is already a fraction."""
    if _is_number(value):
        return float(value)  # type: ignore[arg-type]
    if isinstance(value, str):
        m = _PERCENT.match(value.strip())
        if m:
            return float(m.group(1)) / 100.0
    raise UnitError(value, "a fraction like 0.05 or a percentage like 5%")


def parse_points(value: object) -> float | None:
    """'0.5pp' -> 0.005 (percentage points, an absolute change of a rate); None when `value` is not in points."""
    if isinstance(value, str):
        m = _POINTS.match(value.strip())
        if m:
            return float(m.group(1)) / 100.0
    return None


def parse_money_usd(value: object) -> float:
    if _is_number(value):
        return float(value)  # type: ignore[arg-type]
    if isinstance(value, str):
        m = _MONEY.match(value.strip())
        if m:
            return float(m.group(1))
    raise UnitError(value, "US dollars like $0.5 or 0.5")


def parse_plain_number(value: object) -> float:
    if _is_number(value):
        return float(value)  # type: ignore[arg-type]
    if isinstance(value, str) and _NUMBER.match(value.strip()):
        return float(value)
    raise UnitError(value, "a plain number like 3000 (no unit)")


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.4g}ms"
    return f"{seconds:.4g}s"
