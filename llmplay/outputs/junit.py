"""JUnit XML for CI systems (GitLab, Jenkins, GitHub Actions reporters, Buildkite): one test suite per section,
one test case per gate, step verdict or judged metric (outputs.cases), in the layout of the common JUnit schema
(testsuites > testsuite > properties, testcase > failure | error | skipped, system-out)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from llmplay.archive.writer import atomic_write_text
from llmplay.outputs.cases import ERROR, FAILURE, SKIPPED, Case, cases_of
from llmplay.outputs.facts import Section

# Characters XML 1.0 cannot carry at all (control characters an engine log or an error message may hold).
_NOT_XML = dict.fromkeys(c for c in range(0x20) if c not in (0x9, 0xA, 0xD))


def _text(value: object) -> str:
    return str(value).translate(_NOT_XML)


def _properties(section: Section) -> list[tuple[str, str]]:
    run = section.run
    props = [
        ("command", section.command),
        ("exit_code", str(section.exit_code)),
        ("playbook", f"{run.playbook} {run.playbook_version}".strip()),
        ("run_id", run.run_id),
        ("run_dir", str(run.run_dir)),
        ("engine", run.engine.label),
        ("final_configuration", run.final_config),
        ("hardware", run.hardware),
    ]
    if section.reference is not None:
        props += [("reference_run_id", section.reference.run_id), ("reference_run_dir", str(section.reference.run_dir))]
    if run.report is not None:
        props.append(("report", str(run.report)))
    props += [(f"{what}_html", str(path)) for what, path in section.extra_links]
    return props


def _case_element(suite: ET.Element, case: Case, classname: str) -> None:
    element = ET.SubElement(suite, "testcase", classname=classname, name=_text(case.name), time="0")
    if case.outcome in (FAILURE, ERROR):
        child = ET.SubElement(element, case.outcome, message=_text(case.message), type=case.group)
        child.text = _text("\n".join(filter(None, (case.message, case.detail))))
        return
    if case.outcome == SKIPPED:
        ET.SubElement(element, "skipped", message=_text(case.message))
    # What a passed case found (and a skipped one's details): reporters show it beside the case.
    ET.SubElement(element, "system-out").text = _text("\n".join(filter(None, (case.message, case.detail))))


def _suite(root: ET.Element, section: Section) -> tuple[int, int, int, int]:
    cases = cases_of(section)
    counts = (
        len(cases),
        sum(c.outcome == FAILURE for c in cases),
        sum(c.outcome == ERROR for c in cases),
        sum(c.outcome == SKIPPED for c in cases),
    )
    run = section.run
    suite = ET.SubElement(
        root,
        "testsuite",
        name=_text(section.suite_name),
        tests=str(counts[0]),
        failures=str(counts[1]),
        errors=str(counts[2]),
        skipped=str(counts[3]),
        time="0",
        timestamp=_text(run.started_utc.removesuffix("Z")),
        hostname=_text(run.host or "unknown"),
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in _properties(section):
        ET.SubElement(properties, "property", name=name, value=_text(value))
    for case in cases:
        _case_element(suite, case, f"{run.playbook}.{case.group}")
    return counts


def junit_xml(sections: Sequence[Section]) -> str:
    """The XML document for every section (history --check over several playbooks gives several)."""
    root = ET.Element("testsuites", name="llmplay")
    totals = [0, 0, 0, 0]
    for section in sections:
        totals = [t + c for t, c in zip(totals, _suite(root, section), strict=True)]
    for key, value in zip(("tests", "failures", "errors", "skipped"), totals, strict=True):
        root.set(key, str(value))
    root.set("time", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(path: Path, sections: Sequence[Section]) -> Path:
    atomic_write_text(Path(path), junit_xml(sections))
    return Path(path)
