"""JSON and YAML values as the type checker sees them, and the narrowing every reader of a document uses.

`json.loads` and `yaml.safe_load` return values whose shape the file decides (the libraries leave them untyped);
llmplay takes them as `object` and narrows once, where it reads them: a value of the wrong shape reads as absent.
"""

from __future__ import annotations

from collections.abc import Mapping

JSONScalar = str | int | float | bool | None
JSONValue = JSONScalar | list["JSONValue"] | dict[str, "JSONValue"]  # what json.loads can return


def as_mapping(value: object) -> Mapping[str, object]:
    """A JSON object, or an empty one for anything else (absent, null, a damaged field)."""
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[object]:
    """A JSON array's items (a tuple's too), or none for anything else."""
    return list(value) if isinstance(value, (list, tuple)) else []


def as_number(value: object) -> float | None:
    """A JSON number as a float; None for anything else, booleans included."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def as_text(value: object) -> str | None:
    """A value as text; None stays None."""
    return None if value is None else str(value)
