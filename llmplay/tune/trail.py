"""The tuner's decision trail: per round the incumbent's findings, the ranked candidates with the reason for each
rank, the step chosen, its verdict and the engine time spent; and why the loop stopped. Written to `trail.json`
after every round, so a reader replays every choice and `--resume` continues the same ranking. The run in progress is
recorded before it starts (and its run directory once it exists), so `--resume` continues that run's archive with
`run --resume`'s machinery, keeping the trials it measured."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any  # Any: json.loads' values (trail.json), read into records below

from llmplay.archive.convert import finding_from
from llmplay.archive.model import Finding, to_plain
from llmplay.engines.knobs import Direction, Remedy, Risk
from llmplay.spec import Scalar
from llmplay.tune.rank import Ranked, Tried

TRAIL_FILE = "trail.json"
TUNED_FILE = "tuned.yaml"


@dataclass(frozen=True)
class Raced:
    """One candidate of a raced round: its step, its rank in the round's ranking, and what its own A/B decided."""

    step: str
    rank: int
    remedy: str
    knob: str
    verdict: str  # kept | rejected | inconclusive | failed
    reason: str
    carried: bool = False  # the one the round carried (the first kept in ranking order)
    step_document: Mapping[str, Any] = field(default_factory=dict)  # as Round.step_document


@dataclass(frozen=True)
class Round:
    """One round: the incumbent it diagnosed, what the ranking said, and what the chosen step's A/B decided."""

    number: int  # 0: the baseline and the hand-written steps
    run_dir: str
    incumbent: Mapping[str, Scalar]  # the engine knobs the round started from
    findings: tuple[Finding, ...] = ()  # the incumbent's, which the ranking read (after the round: the new one's)
    ranked: tuple[Ranked, ...] = ()
    step: str | None = None  # the chosen step's name
    step_document: Mapping[str, Any] = field(default_factory=dict)  # a YAML step as PyYAML gives it (untyped)
    verdict: str | None = None
    reason: str = ""
    kept_args: Mapping[str, Scalar] = field(default_factory=dict)  # the incumbent after the round
    engine_s: float = 0.0
    summary: Mapping[str, float] = field(default_factory=dict)  # the new incumbent's pooled figures
    # The chosen step's own pooled figures, kept or not (its prefix reuse achieved, say, beside the incumbent's).
    step_summary: Mapping[str, float] = field(default_factory=dict)
    gates_met: bool | None = None
    # A rejected search's values dropped only for trailing its leader: the next round races them without it.
    retry_values: tuple[Scalar, ...] = ()
    rank: int = 1  # the step's rank in `ranked` (a raced round's carried step may be ranked below the first)
    raced: tuple[Raced, ...] = ()  # a raced round (tune.race on a cluster): every candidate it ran, the step's too
    race: str = ""  # how many it raced and why the one carried was chosen

    @property
    def candidates(self) -> tuple[Raced, ...]:
        """What the round ran: each raced candidate, or its one step."""
        if self.raced or not self.step:
            return self.raced
        chosen = self.chosen
        return (
            Raced(
                self.step,
                self.rank,
                chosen.remedy.value,
                chosen.knob or "",
                self.verdict or "",
                self.reason,
                self.verdict == "kept",
                self.step_document,
            ),
        )

    @property
    def chosen(self) -> Ranked:
        """The ranked candidate the round's step is."""
        return next(c for c in self.ranked if c.rank == self.rank)


PROBE = -1  # Pending.number of the one-request-alone probe


@dataclass(frozen=True)
class Entrant:
    """A raced round's candidate before its run: its rank in the round's ranking and its step."""

    rank: int
    step_document: Mapping[str, Any]  # a YAML step as PyYAML gives it (untyped), `carry: race`


@dataclass(frozen=True)
class Pending:
    """The run in progress (or interrupted): `--resume` continues its archive, or starts it again when none exists."""

    number: int  # the round's number; PROBE for the one-request-alone probe
    playbook: str  # the playbook it runs: alone.yaml, the session's playbook (round 0), round-N.yaml
    run_dir: str = ""  # its archive, once the run made one
    ranked: tuple[Ranked, ...] = ()  # a round's ranking, kept as it was when the round chose its step
    step: str | None = None  # the step ranked first (a raced round's first candidate)
    step_document: Mapping[str, Any] = field(default_factory=dict)  # a YAML step as PyYAML gives it (untyped)
    raced: tuple[Entrant, ...] = ()  # a raced round (tune.race on a cluster): every candidate it runs, in rank order
    race: str = ""  # how many it races, as Round.race


@dataclass(frozen=True)
class Trail:
    playbook: str  # the playbook's path
    rounds: tuple[Round, ...] = ()
    alone: Mapping[str, float] = field(default_factory=dict)  # the unloaded probe's figures
    alone_run: str = ""
    alone_s: float = 0.0
    stop: str = ""  # why the loop stopped ("" while it runs)
    infeasible: bool = False
    final_ranking: tuple[Ranked, ...] = ()  # the ranking the loop stopped on
    pending: Pending | None = None  # the run in progress; None between runs

    @property
    def engine_s(self) -> float:
        """Wall time of engine work so far: the probe and every round, engine starts included."""
        return self.alone_s + sum(r.engine_s for r in self.rounds)

    def tried(self) -> tuple[Tried, ...]:
        return tuple(
            Tried(Remedy(c.remedy), c.knob, c.verdict, f"round {r.number}") for r in self.rounds for c in r.candidates
        )

    def with_round(self, done: Round) -> Trail:
        return replace(self, rounds=(*self.rounds, done))


def save(trail: Trail, tune_dir: Path) -> None:
    tmp = tune_dir / f"{TRAIL_FILE}.tmp"
    tmp.write_text(json.dumps(to_plain(trail), indent=1, sort_keys=False))
    tmp.replace(tune_dir / TRAIL_FILE)


def load(tune_dir: Path) -> Trail:
    raw = json.loads((tune_dir / TRAIL_FILE).read_text())
    return Trail(
        playbook=str(raw["playbook"]),
        rounds=tuple(_round(r) for r in raw.get("rounds", ())),
        alone={str(k): float(v) for k, v in dict(raw.get("alone") or {}).items()},
        alone_run=str(raw.get("alone_run") or ""),
        alone_s=float(raw.get("alone_s") or 0.0),
        stop=str(raw.get("stop") or ""),
        infeasible=bool(raw.get("infeasible")),
        final_ranking=tuple(_ranked(c) for c in raw.get("final_ranking", ())),
        pending=_pending(raw["pending"]) if raw.get("pending") else None,
    )


def _pending(p: Mapping[str, Any]) -> Pending:  # Any: json.loads' values (trail.json), copied as written
    return Pending(
        number=int(p["number"]),
        playbook=str(p["playbook"]),
        run_dir=str(p.get("run_dir") or ""),
        ranked=tuple(_ranked(c) for c in p.get("ranked", ())),
        step=p.get("step"),
        step_document=dict(p.get("step_document") or {}),
        raced=tuple(Entrant(int(e["rank"]), dict(e["step_document"])) for e in p.get("raced", ())),
        race=str(p.get("race") or ""),
    )


def _round(r: Mapping[str, Any]) -> Round:  # Any: json.loads' values (trail.json), copied as written
    return Round(
        number=int(r["number"]),
        run_dir=str(r["run_dir"]),
        incumbent=dict(r.get("incumbent") or {}),
        findings=tuple(finding_from(f) for f in r.get("findings", ())),
        ranked=tuple(_ranked(c) for c in r.get("ranked", ())),
        step=r.get("step"),
        step_document=dict(r.get("step_document") or {}),
        verdict=r.get("verdict"),
        reason=str(r.get("reason") or ""),
        kept_args=dict(r.get("kept_args") or {}),
        engine_s=float(r.get("engine_s") or 0.0),
        summary={str(k): float(v) for k, v in dict(r.get("summary") or {}).items()},
        step_summary={str(k): float(v) for k, v in dict(r.get("step_summary") or {}).items()},
        gates_met=r.get("gates_met"),
        retry_values=tuple(r.get("retry_values") or ()),
        rank=int(r.get("rank") or 1),
        raced=tuple(Raced(**dict(c)) for c in r.get("raced", ())),
        race=str(r.get("race") or ""),
    )


def _ranked(c: Mapping[str, Any]) -> Ranked:  # Any: as _round
    return Ranked(
        remedy=Remedy(c["remedy"]),
        direction=Direction(c["direction"]),
        knob=c.get("knob"),
        values=tuple(c.get("values") or ()),
        findings=tuple(c.get("findings") or ()),
        evidence=str(c.get("evidence") or ""),
        reason=str(c.get("reason") or ""),
        rank=c.get("rank"),
        risk=Risk(c.get("risk") or Risk.SAFE),
        bears_on_binding=bool(c.get("bears_on_binding")),
    )
