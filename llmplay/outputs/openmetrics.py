"""OpenMetrics text of the final configuration's figures, for node_exporter's textfile collector or a Pushgateway.

Every family is a gauge labelled with the playbook, the engine, its version and image, and the configuration, so
a dashboard draws one line per playbook and engine across nightly runs; the run id is a label of `llmplay_run_info`
only (as a label of every figure it would start a new series each night). Written by prometheus_client's own
OpenMetrics exposition, and atomically: the textfile collector reads every `*.prom` file in its directory at any
moment, so the text is written to a temp file that does not end in `.prom`, then renamed over the target.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from llmplay.catalog import label_of, metric_info
from llmplay.errors import ExitCode
from llmplay.outputs.facts import RunFacts, Section

PREFIX = "llmplay"
LABELS = ("playbook", "engine", "engine_version", "image", "config")
# OpenMetrics units by the catalog's: the family's name ends with it (`llmplay_ttft_p95_seconds`).
_UNITS = {"s": "seconds", "fraction": "ratio", "bytes": "bytes"}


def family_name(metric: str) -> tuple[str, str]:
    """The family name (without its unit) and unit of a metric path: ("llmplay_ttft_p95", "seconds")."""
    info = metric_info(metric)
    unit = _UNITS.get(info.unit, "") if info is not None else ""
    return f"{PREFIX}_" + re.sub(r"[^a-zA-Z0-9_]", "_", metric), unit


def _labels(run: RunFacts) -> list[str]:
    engine = run.engine
    return [run.playbook, engine.kind, engine.version or "", engine.image or "", run.final_config]


def _timestamp_s(utc: str) -> float | None:
    try:
        return dt.datetime.strptime(utc, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        return None


class _Families:
    """Gauge families by name, each built once whichever section adds to it first."""

    def __init__(self) -> None:
        self.by_name: dict[str, GaugeMetricFamily] = {}

    def add(
        self, name: str, doc: str, labels: Sequence[str], values: Sequence[str], value: float, unit: str = ""
    ) -> None:
        family = self.by_name.get(name)
        if family is None:
            family = self.by_name[name] = GaugeMetricFamily(name, doc, labels=list(labels), unit=unit)
        family.add_metric(list(values), float(value))


def _run_families(families: _Families, section: Section) -> None:
    run = section.run
    labels, values = list(LABELS), _labels(run)
    for metric, value in sorted(run.figures.items()):
        name, unit = family_name(metric)
        families.add(name, f"{label_of(metric)} of the final configuration ({metric})", labels, values, value, unit)
    families.add(
        f"{PREFIX}_run_info",
        "The run these figures come from",
        [*labels, "command", "run_id", "status", "host", "llmplay_version"],
        [*values, section.command, run.run_id, run.status, run.host, run.llmplay_version],
        1,
    )
    families.add(f"{PREFIX}_exit_code", "The command's exit code (0 passed)", labels, values, section.exit_code)
    started = _timestamp_s(run.started_utc)
    if started is not None:
        families.add(f"{PREFIX}_run_start_timestamp", "When the run started", labels, values, started, "seconds")
    for gate in run.gates:
        gate_labels, gate_values = [*labels, "gate", "metric"], [*values, gate.gate, gate.metric]
        families.add(
            f"{PREFIX}_gate_met", "1 when the gate is met, 0 when not", gate_labels, gate_values, gate.met or 0
        )
    if section.comparison is None:
        for verdict in ("kept", "rejected", "inconclusive", "failed"):
            count = sum(v.verdict == verdict for v in run.verdicts)
            families.add(f"{PREFIX}_steps", "Steps by verdict", [*labels, "verdict"], [*values, verdict], count)


def _comparison_families(families: _Families, section: Section) -> None:
    comparison = section.comparison
    if comparison is None:
        return
    labels, values = [*LABELS, "reference_run_id"], [*_labels(section.run), comparison.a.run_id]
    regressed = section.exit_code == ExitCode.REGRESSION
    families.add(f"{PREFIX}_regression", "1 when this run regressed against the reference", labels, values, regressed)
    for m in comparison.metrics:
        if not m.role or m.rel_change is None:
            continue
        bounds = [("estimate", m.rel_change), ("low", m.ci_low), ("high", m.ci_high)]
        for bound, value in bounds:
            if value is not None:
                families.add(
                    f"{PREFIX}_relative_change",
                    f"Change against the reference, relative, with its {comparison.ci_label} bounds",
                    [*labels, "metric", "role", "bound"],
                    [*values, m.metric, m.role, bound],
                    value,
                    "ratio",
                )


class _Sections(Collector):
    def __init__(self, sections: Sequence[Section]):
        self.sections = sections

    def collect(self) -> Iterator[Metric]:
        families = _Families()
        for section in self.sections:
            _run_families(families, section)
            _comparison_families(families, section)
        yield from families.by_name.values()


def openmetrics_text(sections: Sequence[Section]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Sections(sections))
    # prometheus_client's exposition functions are unannotated; the text they return is bytes.
    exposition: bytes = generate_latest(registry)  # type: ignore[no-untyped-call]
    return exposition.decode("utf-8")


def write_metrics(path: Path, sections: Sequence[Section]) -> Path:
    """Write atomically: a temp file beside `path` (named so no `*.prom` glob matches it), then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(openmetrics_text(sections))
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_name, 0o644)  # the collector runs as another user; mkstemp makes 0600
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path
