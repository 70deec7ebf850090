"""`Any` stays where a third-party API forces it, each line saying which (issue 37): JSON and YAML are read as
`object` and narrowed (llmplay.jsonvalue), playbook sections as the TypedDicts the schema has checked
(playbook.document), third-party values by their libraries' own names."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "llmplay"
MAX_ANY_LINES = 60


def _any_lines() -> list[tuple[str, str]]:
    """Every line of llmplay/ that `grep -rn Any llmplay --include=*.py` lists."""
    return [
        (f"{path.relative_to(PACKAGE.parent)}:{number}", line)
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if "Any" in line
    ]


def test_at_most_sixty_lines_use_any():
    lines = _any_lines()
    assert len(lines) <= MAX_ANY_LINES, f"{len(lines)} lines use Any (at most {MAX_ANY_LINES}): {[w for w, _ in lines]}"


def test_every_any_says_which_third_party_api_forces_it():
    uncommented = [where for where, line in _any_lines() if "#" not in line]
    assert not uncommented, f"Any without a comment naming the API that forces it: {uncommented}"
