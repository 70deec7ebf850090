"""View models of one archived run: everything the report template shows, built from the archive's records alone.

Strings, lists and inline SVG charts, so the template only lays them out; nothing here touches the network. Each
section has its module (record, steps, diagnosis, method); this one holds the page's head and puts them together.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmplay.archive.model import TRIAL_OK
from llmplay.archive.reader import ArchivedRun
from llmplay.archive.verdicts import kept_means
from llmplay.catalog import absence_reason, fmt_full, fmt_pct, label_of
from llmplay.report.data import RunData, arrow
from llmplay.report.diagnosis import diagnosis, rules_checked
from llmplay.report.method import goals, method
from llmplay.report.record import capacity, record_columns, record_table
from llmplay.report.shape import workload_shape
from llmplay.report.steps import steps


def _engine_facts(run: RunData) -> dict[str, str]:
    facts = run.archive.engine_facts()
    return {
        "kind": facts.kind,
        "image": facts.image or "—",
        "digest": facts.digest or "not recorded",
        "version": facts.version or "not reported",
        "model": facts.model,
        "images": ", ".join(facts.images),
    }


def _header(run: RunData) -> dict[str, object]:
    info, env = run.info, run.info.environment
    gpu_hours = sum(t.wall_s * run.gpus_of(t.config_id) for t in run.trials.values()) / 3600
    wall_hours = sum(t.wall_s for t in run.trials.values()) / 3600
    gpu_text = env.gpu_label
    if env.gpu is not None and env.gpu.name:
        gpu_text += f" · driver {env.gpu.driver or '?'} · CUDA {env.gpu.cuda or '?'}"
    elif env.gpu is not None and env.gpu.error:
        gpu_text += f" ({env.gpu.error})"
    return {
        "name": info.playbook.name,
        "version": info.playbook.version,
        "started": env.started_utc,
        "finished": info.finished_utc,
        "who": f"{env.user or '?'}@{env.host or '?'}",
        "platform": env.platform,
        "engine": _engine_facts(run),
        "gpu": gpu_text,
        "llmplay_version": env.llmplay_version or "?",
        "python": env.python,
        "docker": env.docker or "—",
        "seed": env.seed,
        "gpu_hours": f"{gpu_hours:.3f}" if gpu_hours else "0 (no GPU used)",
        "wall_hours": f"{wall_hours:.3f}",
        "status": info.status,
        "exit_code": info.exit_code,
        "run_id": info.run_id,
        "trials": len(run.trials),
        "failed_trials": sum(1 for t in run.trials.values() if t.status != TRIAL_OK),
        "playbook_path": info.playbook.path,
        "playbook_sha256": info.playbook.sha256,
    }


def _shared_host(run: RunData) -> dict[str, object] | None:
    """Which trials other llmplay runs shared the host with: their load was in those trials' figures."""
    shared = [t for t in run.trials.values() if t.shared_with]
    if not shared:
        return None
    runs = {o.run_id: o for t in shared for o in t.shared_with or ()}
    return {
        "trials": len(shared),
        "of": len(run.trials),
        "runs": [
            f"{rid} ({o.playbook or '?'}, pid {'?' if o.pid is None else o.pid})" for rid, o in sorted(runs.items())
        ],
    }


def _glance(run: RunData) -> dict[str, object]:
    gates = []
    for g in run.archive.gates():
        state = "not measured" if g.met is None else ("met" if g.met else "failed")
        # The runner's own note (why not measured, or a thin sample) when it wrote one; else the catalog's reason.
        note = g.note or (absence_reason(g.metric) if g.observed is None else "")
        gates.append(
            {
                "gate": g.gate,
                "note": note,
                "observed": fmt_full(g.metric, g.observed),
                "state": state,
                "margin": fmt_pct(g.margin) if g.margin is not None else "—",
                "label": label_of(g.metric),
            }
        )
    config = run.config(run.final)
    kept = [v for v in run.verdicts if v.carried]
    return {
        "gates": gates,
        "met": sum(1 for g in gates if g["state"] == "met"),
        "total": len(gates),
        "final": run.final or "—",
        "docker_command": config.docker_command if config else "",
        "engine_command": " ".join(config.command) if config else "",
        "kept": [{"step": v.step, "changes": [arrow(c) for c in v.changes]} for v in kept],
        "counts": {
            k: sum(1 for v in run.verdicts if v.verdict == k) for k in ("kept", "rejected", "inconclusive", "failed")
        },
    }


def build_context(archive: ArchivedRun, *, unverified: Sequence[str] = ()) -> dict[str, object]:
    """Everything the template shows, as strings, lists and inline SVG; nothing here touches the network.

    `unverified`: what verification found wrong with a run rendered anyway (the page opens with it)."""
    run = RunData(archive)
    playbook = archive.playbook_as_run()
    found = archive.diagnosis()
    info = run.info
    record, record_notes = record_table(run)
    return {
        "header": _header(run),
        "glance": _glance(run),
        "goals": goals(playbook),
        "columns": [label for _, label in record_columns(run)],
        "record": record,
        "record_notes": record_notes,
        "capacity": capacity(run),
        "shape": workload_shape(run),
        "steps": steps(run, playbook.step_descriptions, kept_means(playbook.min_effect, playbook.trials.confidence)),
        "diagnosis": diagnosis(found, archive.findings()),
        "method": method(run, playbook, rules_checked(found)),
        "overridden": bool(info.overrides),
        "shared_host": _shared_host(run),
        "audit": {
            "run_dir": str(archive.run_dir),
            "files": info.files,
            "manifest_sha256": info.manifest_sha256,
            "report_error": info.report_error,
            "signed": archive.signed(),
            "redacted": list(info.redacted),
        },
        "unverified": list(unverified),
        "playbook_text": archive.read_text(info.playbook.file) or "",
    }
