"""One archived run as the report's sections read it: typed records from the archive reader, each trial's requests
read once (several sections chart them), and the cell text every table shares (values, "not measured", thin marks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pandas as pd

from llmplay.archive.model import TRIAL_OK, ConfigRecord, TrialRecord, TrialRequests
from llmplay.archive.reader import ArchivedRun, requests_from
from llmplay.catalog import SAMPLE_COUNT_KEYS, absence_reason, fmt_value, label_of, thin_sample
from llmplay.spec import gpu_count

NOT_MEASURED = "not measured"
THIN_MARK = "†"  # beside a percentile from too few requests; the warning itself is printed under its table
V = TypeVar("V")


def arrow(change: str) -> str:
    return change.replace(" -> ", " → ")


def value_of(figures: Mapping[str, V], key: str) -> V | None:
    """A figure by name from a record's mapping (a summary, a row's metrics); None when it was not measured."""
    return figures.get(key)


def concat(arrays: Iterable[np.ndarray]) -> np.ndarray:
    arrays = [a for a in arrays if a.size]
    return np.concatenate(arrays) if arrays else np.array([], dtype=float)


@dataclass
class Remarks:
    """What a table's figures cannot say by themselves, as visible text: which figures are not measured and why,
    and which percentiles rest on too few requests (catalog.absence_reason, catalog.thin_sample)."""

    absent: dict[str, list[str]]  # reason -> labels of the figures it explains
    thin: list[str]

    @classmethod
    def new(cls) -> Remarks:
        return cls({}, [])

    def cell(self, metric: str, value: float | None, samples: Mapping[str, float]) -> str:
        """The cell text of one figure: its value ("†" when its sample is thin), or "not measured"."""
        if value is None:
            labels = self.absent.setdefault(absence_reason(metric), [])
            if label_of(metric) not in labels:
                labels.append(label_of(metric))
            return NOT_MEASURED
        shown = fmt_value(metric, value)
        warning = thin_sample(metric, samples)
        if warning is None:
            return shown
        if warning not in self.thin:
            self.thin.append(warning)
        return f"{shown} {THIN_MARK}"

    def lines(self) -> list[str]:
        out = [f"{', '.join(labels)} not measured: {reason}" for reason, labels in self.absent.items()]
        out += [f"{THIN_MARK} {warning}: too few to mean much" for warning in self.thin]
        return out


def folded_remarks(rows: Sequence[tuple[str, Remarks]]) -> list[str]:
    """The remarks of a table's rows once per reason, under the table: which figures are not measured and why, and
    each thin percentile's warning, naming the rows each applies to ("every configuration" when it is all of them).
    Repeated under every row, the same reason pushed the table off the first screen."""
    everyone = [config for config, _ in rows]
    absent: dict[str, dict[str, list[str]]] = {}  # reason -> label -> the rows it is absent in
    thin: dict[str, list[str]] = {}  # warning -> the rows it marks
    for config, remarks in rows:
        for reason, labels in remarks.absent.items():
            for label in labels:
                absent.setdefault(reason, {}).setdefault(label, []).append(config)
        for warning in remarks.thin:
            thin.setdefault(warning, []).append(config)

    def where(configs: Sequence[str]) -> str:
        return "every configuration" if list(configs) == everyone else ", ".join(configs)

    def scope(text: str) -> str:
        return f" ({text})" if len(everyone) > 1 else ""

    notes = []
    for reason, by_label in absent.items():
        groups: dict[tuple[str, ...], list[str]] = {}
        for label, configs in by_label.items():
            groups.setdefault(tuple(configs), []).append(label)
        if len(groups) == 1:
            where_text = where(next(iter(groups)))
        else:
            where_text = "; ".join(f"{', '.join(labels)} in {where(configs)}" for configs, labels in groups.items())
        notes.append(f"{', '.join(by_label)} not measured: {reason}{scope(where_text)}")
    notes += [
        f"{THIN_MARK} {warning}: too few to mean much{scope(where(configs))}" for warning, configs in thin.items()
    ]
    return notes


def pooled_samples(trials: Iterable[TrialRecord]) -> dict[str, int]:
    """How many requests a configuration's pooled figures rest on: each count summed over its ok trials; a count
    some trial does not carry (an archive from before counts were kept) is left out, so nothing is marked."""
    ok = [t for t in trials if t.status == TRIAL_OK]
    return {
        key: int(sum(t.summary[key] for t in ok))
        for key in SAMPLE_COUNT_KEYS
        if ok and all(key in t.summary for t in ok)
    }


class RunData:
    """One archived run's head, trials, configurations and verdicts as records, each trial's requests read from
    disk once and its telemetry on demand; every section reads through it."""

    def __init__(self, archive: ArchivedRun):
        self.archive = archive
        self.info = archive.info
        self.trials = {t.trial_id: t for t in archive.trials()}
        self.configs = {c.config_id: c for c in archive.configs()}
        self.verdicts = archive.verdicts()
        self._requests: dict[str, TrialRequests] = {}

    @property
    def final(self) -> str | None:
        return self.info.final_config_id

    def trial(self, trial_id: str) -> TrialRecord | None:
        return self.trials.get(trial_id)

    def config(self, config_id: str | None) -> ConfigRecord | None:
        return self.configs.get(config_id or "")

    def requests(self, trial_id: str) -> TrialRequests:
        if trial_id not in self._requests:
            trial = self.trial(trial_id)
            if trial is None or "records" not in trial.files:
                self._requests[trial_id] = requests_from(None)
            else:
                self._requests[trial_id] = self.archive.requests(trial_id)
        return self._requests[trial_id]

    def telemetry(self, trial_id: str) -> pd.DataFrame | None:
        trial = self.trial(trial_id)
        if trial is None or "telemetry" not in trial.files:
            return None
        return self.archive.load_telemetry(trial_id)

    def trials_of(self, config_id: str) -> list[TrialRecord]:
        return [t for t in self.trials.values() if t.config_id == config_id and t.superseded is None]

    def gpus_of(self, config_id: str) -> int:
        config = self.config(config_id)
        return gpu_count(config.engine.gpus if config else 0)
