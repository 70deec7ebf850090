"""A step kind is one module: this one registers a fourth kind, `double:` (the configuration so far with one workload
field doubled, a value chosen when the step runs, as a tuner's kind chooses), and no line of llmplay/ names it. The
playbook reads it (its schema entry included), the plan prints it, and the real step loop runs it against a real
endpoint (the instrument server): A/B pairs, verdict, archive, report, and --resume after an interrupt."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmplay.archive.reader import ArchivedRun
from llmplay.archive.verify import verify
from llmplay.commands.plan import render_plan
from llmplay.errors import PlaybookError
from llmplay.plan import build_plan
from llmplay.playbook.load import load_playbook
from llmplay.playbook.problems import Problems
from llmplay.playbook.source import SourceMap, YamlPath
from llmplay.report import render_report
from llmplay.spec import Change, ChangeEffect, Config, Scalar, Step, apply_change, current_value
from llmplay.tuning.book import ConfigTrials
from llmplay.tuning.kinds import register_step_kind, unregister_step_kind
from llmplay.tuning.run import RunOptions, TuningRun
from llmplay.tuning.step_kind import Loop
from llmplay.tuning.trial import FreshEngineTrial
from llmplay_testing.instrument import InstrumentServer, scenario_url

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Doubled:
    """The step's choice (spec.StepChoice): which workload field it doubles."""

    target: str

    @property
    def kind(self) -> str:
        return "double"

    def tried(self) -> tuple[Change, ...]:
        return ()  # the value is known only when the step runs

    def describe(self) -> str | None:
        return f"doubles {self.target} of the configuration so far"


class DoubleForm:
    """How the playbook reads it (playbook.step_forms.StepForm), with its schema entry."""

    key = "double"
    schema: Mapping[str, Any] = {
        "double": {"type": "string", "pattern": "^workload\\.", "description": "A workload field to double."}
    }

    def parse(
        self, item: Mapping[str, Any], path: YamlPath, workload_fields: Collection[str], problems: Problems
    ) -> Step:
        field_name = item["double"].removeprefix("workload.")
        if field_name not in workload_fields:
            problems.add((*path, "double"), f"found '{field_name}'; expected a workload field a step may set")
        return Step(
            name=item["name"],
            changes=(),
            carry=item.get("carry", "if_kept"),
            line=problems.sources.locate(path).line,
            choice=Doubled(item["double"]),
        )

    def knobs(self, index: int, step: Step, sources: SourceMap) -> Iterator[tuple[YamlPath, str, Scalar]]:
        return iter(())


class DoubleKind:
    """How the run runs it (tuning.step_kind.StepKind): one candidate, measured by the loop as any fixed change."""

    form = DoubleForm()

    def run(self, loop: Loop, index: int, step: Step, best: ConfigTrials) -> ConfigTrials:
        assert isinstance(step.choice, Doubled)
        target = step.choice.target
        now = current_value(best.config, target)
        changed = apply_change(best.config, Change(target, now * 2))
        candidate = Config(step.name, changed.engine, changed.workload)
        return loop.measure_candidate(index, step, best, candidate, (ChangeEffect(target, now, now * 2),))


@pytest.fixture
def double_kind() -> Iterator[DoubleKind]:
    kind = DoubleKind()
    register_step_kind(kind)
    yield kind
    unregister_step_kind(kind.form.key)


def write_playbook(tmp_path: Path, url: str, step: dict[str, Any]) -> Path:
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["runtime"] = {"kind": "endpoint", "url": url}
    doc["workload"].update(duration="1s", warmup="0s", concurrency=1)
    doc["trials"] = {"repeats": 2}
    # A few dozen requests a side cannot show an error rate within points: this test is about the loop, not rates.
    doc["goals"]["guards"] = [g for g in doc["goals"]["guards"] if g["metric"] != "errors.rate"]
    doc["steps"] = [step]
    path = tmp_path / "double.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_kind_registered_here_is_read_planned_and_checked_like_a_built_in(tmp_path, double_kind):
    path = write_playbook(tmp_path, "http://127.0.0.1:9", {"name": "twice", "double": "workload.concurrency"})
    pb = load_playbook(path)
    assert pb.steps[0].choice == Doubled("workload.concurrency")
    assert "  doubles workload.concurrency of the configuration so far" in render_plan(build_plan(pb)).splitlines()
    # Its schema entry is checked as the shipped ones are, and its own parse says what is wrong where.
    with pytest.raises(PlaybookError, match=r"steps\[0\]\.double: found 'concurrency'; expected"):
        load_playbook(write_playbook(tmp_path, "http://127.0.0.1:9", {"name": "twice", "double": "concurrency"}))
    with pytest.raises(PlaybookError, match=r"steps\[0\]\.double: found 'colour'; expected a workload field"):
        load_playbook(write_playbook(tmp_path, "http://127.0.0.1:9", {"name": "twice", "double": "workload.colour"}))


def test_without_its_module_the_kind_is_an_unknown_key(tmp_path):
    path = write_playbook(tmp_path, "http://127.0.0.1:9", {"name": "twice", "double": "workload.concurrency"})
    with pytest.raises(PlaybookError, match=r"steps\[0\]\.double: unknown key 'double'"):
        load_playbook(path)


def test_the_real_step_loop_runs_and_resumes_a_registered_kind(tmp_path, double_kind, monkeypatch):
    measured: list[tuple[str | None, str, int, int | None]] = []
    real = FreshEngineTrial.__call__
    stop_at: list[int] = [3]  # the third trial is interrupted (Ctrl-C) before it measures

    def counted(self: FreshEngineTrial, config: Config, **key: Any) -> Any:
        if len(measured) + 1 == stop_at[0]:
            stop_at[0] = 0
            raise KeyboardInterrupt("Ctrl-C")
        measured.append((key["step"], key["role"], key["repeat"], config.workload.concurrency))
        return real(self, config, **key)

    monkeypatch.setattr(FreshEngineTrial, "__call__", counted)
    with InstrumentServer() as server:
        url = scenario_url(server.url, ttft_ms=5, itl_ms=1)
        pb = load_playbook(write_playbook(tmp_path, url, {"name": "twice", "double": "workload.concurrency"}))
        lines: list[str] = []
        first = TuningRun(pb, RunOptions(archive_root=tmp_path / "r"), report=lines.append).execute()
        assert first.status == "interrupted", lines
        assert len(measured) == 2
        resumed_lines: list[str] = []
        options = RunOptions(archive_root=tmp_path / "r", resume=first.run_dir)
        outcome = TuningRun(pb, options, report=resumed_lines.append).execute()
    assert outcome.status == "complete", resumed_lines
    # Four trials in all (two A/B pairs), none measured twice; the candidate ran at twice the users.
    assert len(measured) == 4 and len(set(measured)) == 4
    assert {(role, users) for step, role, _, users in measured if step == "twice"} == {
        ("baseline", 1),
        ("candidate", 2),
    }
    (verdict,) = ArchivedRun.open(outcome.run_dir).verdicts()
    assert verdict.step == "twice" and verdict.changes == ("workload.concurrency: 1 -> 2",)
    assert len(verdict.trials_baseline) == len(verdict.trials_candidate) == 2
    assert verdict.verdict in ("kept", "rejected", "inconclusive")
    assert any(line.startswith("step 1/1 twice: workload.concurrency: 1 -> 2") for line in resumed_lines)
    assert "workload.concurrency: 1 → 2" in render_report(outcome.run_dir).read_text()
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    assert [row["config_id"] for row in manifest["tuning_record"]] == ["baseline", "twice"]
    assert verify(outcome.run_dir) == []
