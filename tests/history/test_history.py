"""History across runs: the SQLite index against the manifests, change detection, --accept/--check, the site."""

from __future__ import annotations

import json
import os
import shutil
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmplay.archive.index import INDEX_FILE, ArchiveIndex
from llmplay.archive.layout import MANIFEST
from llmplay.cli import cli
from llmplay.errors import ExitCode
from llmplay.history.site import write_site
from llmplay.history.timeline import REGRESSION, build_history, format_history
from llmplay_testing.history_archive import BUILDS, PLAYBOOK_NAME, make_history_archive
from llmplay_testing.html_checks import chromium, dom_in_chromium
from llmplay_testing.make_archive import make_archive

UPGRADE_AT = 8


@pytest.fixture(scope="module")
def clones(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 runs of nightly-tiny: the engine upgrade at run 8 makes TTFT 60% slower."""
    root = tmp_path_factory.mktemp("history") / "reports"
    make_history_archive(root, 12, upgrade_at=UPGRADE_AT)
    return root


def copy_of(root: Path, tmp_path: Path) -> Path:
    target = tmp_path / "reports"
    shutil.copytree(root, target)
    return target


def runs_with_warnings(root: Path, playbook: str | None = PLAYBOOK_NAME) -> tuple[list, list[str]]:
    warnings: list[str] = []
    return ArchiveIndex(root, warnings.append).runs(playbook), warnings


# ---------------------------------------------------------------------------------------------- the index
def test_the_index_is_built_from_the_manifests_then_kept_in_step(clones, tmp_path):
    root = copy_of(clones, tmp_path)
    (root / INDEX_FILE).unlink(missing_ok=True)
    runs, warnings = runs_with_warnings(root)
    assert len(runs) == 12 and warnings == [f"{root / INDEX_FILE}: no index yet; built from the manifests"]
    assert [r.started_utc for r in runs] == sorted(r.started_utc for r in runs)
    again, warnings = runs_with_warnings(root)
    assert warnings == [] and [r.run_id for r in again] == [r.run_id for r in runs]
    first = runs[0]
    assert first.verified and first.kind == "run" and first.hardware == "CPU only"
    assert len(first.figures["ttft.p95"]) == 3 and first.goals is not None
    assert first.goals.objective is not None and first.goals.objective.metric == "ttft.p95"


def test_an_index_that_disagrees_with_the_manifests_is_brought_back_with_a_warning(clones, tmp_path):
    root = copy_of(clones, tmp_path)
    runs, _ = runs_with_warnings(root)
    edited, gone = root / runs[3].path, root / runs[5].path
    manifest = json.loads((edited / MANIFEST).read_text())
    manifest["trials"][0]["summary"]["ttft.p95"] = 0.001  # a figure edited after the run: fails verification
    (edited / MANIFEST).write_text(json.dumps(manifest))
    shutil.rmtree(gone)
    runs, warnings = runs_with_warnings(root)
    assert len(warnings) == 1 and "disagreed with the manifests" in warnings[0]
    assert "1 changed since indexed" in warnings[0] and "1 gone" in warnings[0]
    assert len(runs) == 11
    tampered = next(r for r in runs if r.path == edited.relative_to(root).as_posix())
    assert not tampered.verified and not tampered.usable and "manifest_sha256" in tampered.problems[0]


def test_an_unreadable_index_is_rebuilt_with_a_warning(clones, tmp_path):
    root = copy_of(clones, tmp_path)
    (root / INDEX_FILE).write_bytes(b"not a database at all" * 100)
    runs, warnings = runs_with_warnings(root)
    assert len(runs) == 12
    assert warnings == [f"{root / INDEX_FILE}: unreadable or of another llmplay version; rebuilt from the manifests"]


def test_rebuild_reads_each_manifest_once_and_lists_what_it_cannot_read(clones, tmp_path, monkeypatch):
    root = copy_of(clones, tmp_path)
    broken = root / PLAYBOOK_NAME / "20990101T000000Z-000000"
    broken.mkdir()
    (broken / MANIFEST).write_text("{ not json")
    reads: list[str] = []
    import llmplay.archive.index as index_module

    real = index_module._read_run_file

    def counting(run_dir, name, max_bytes):
        if name == MANIFEST:  # the signature beside it is read too (its digest is part of the row)
            reads.append(str(run_dir))
        return real(run_dir, name, max_bytes)

    monkeypatch.setattr(index_module, "_read_run_file", counting)
    index = ArchiveIndex(root)
    assert index.rebuild() == 12
    assert len(reads) == 13 and len(set(reads)) == 13
    assert [u.path for u in index.unreadable()] == [f"{PLAYBOOK_NAME}/20990101T000000Z-000000"]


def test_a_finished_run_is_indexed_by_the_writer(tmp_path):
    run_dir = make_archive(tmp_path)
    root = run_dir.parent.parent
    assert (root / INDEX_FILE).is_file()
    runs, warnings = runs_with_warnings(root, None)
    assert warnings == [] and [r.run_id for r in runs] == [run_dir.name]


# ---------------------------------------------------------------------------------------------- change detection
def test_the_engine_upgrade_is_flagged_where_the_trials_show_it_and_nowhere_else(clones):
    runs, _ = runs_with_warnings(clones)
    history = build_history(PLAYBOOK_NAME, runs, None)
    flags = history.flags
    assert [(f.run_id, f.metric, f.direction) for f in flags] == [(runs[UPGRADE_AT].run_id, "ttft.p95", REGRESSION)]
    text = flags[0].text()
    assert f"engine version {BUILDS[0].version} -> {BUILDS[1].version}" in text
    assert "image digest" in text and "beyond its 10%" in text and runs[UPGRADE_AT - 1].run_id in text
    printed = format_history(history)
    assert printed.count("\n2") == 12  # every run, oldest first
    assert "! REGRESSION objective P95 TTFT" in printed and "[" in printed  # figures carry their intervals


def test_a_configuration_change_is_marked_and_never_compared_across(clones, tmp_path):
    root = copy_of(clones, tmp_path)
    runs, _ = runs_with_warnings(root)
    later = root / runs[UPGRADE_AT].path
    manifest = json.loads((later / MANIFEST).read_text())
    manifest["configs"][0]["engine"]["args"]["parallel"] = 1
    from llmplay.archive.verify import manifest_sha256

    manifest["manifest_sha256"] = manifest_sha256(manifest)
    (later / MANIFEST).write_text(json.dumps(manifest))
    runs, _ = runs_with_warnings(root)
    history = build_history(PLAYBOOK_NAME, runs, None)
    row = history.rows[UPGRADE_AT]
    assert any("configuration changed: engine.args.parallel: 4 -> 1" in m for m in row.marks)
    assert row.previous is None and row.flags == ()  # the first of its series: nothing to compare with
    assert history.rows[UPGRADE_AT + 1].marks[0].startswith("configuration changed")


def test_a_run_that_fails_verification_is_listed_never_used(clones, tmp_path):
    root = copy_of(clones, tmp_path)
    runs, _ = runs_with_warnings(root)
    tampered = root / runs[UPGRADE_AT].path
    manifest = json.loads((tampered / MANIFEST).read_text())
    manifest["status"] = "complete "
    (tampered / MANIFEST).write_text(json.dumps(manifest))
    runs, _ = runs_with_warnings(root)
    history = build_history(PLAYBOOK_NAME, runs, None)
    row = history.rows[UPGRADE_AT]
    assert any(m.startswith("FAILS VERIFICATION") for m in row.marks) and row.flags == ()
    assert history.rows[UPGRADE_AT + 1].flags[0].previous_run_id == runs[UPGRADE_AT - 1].run_id
    result = CliRunner().invoke(cli, ["history", "--accept", runs[UPGRADE_AT].run_id, "--archive", str(root)])
    assert result.exit_code == ExitCode.INFRA and "cannot be a reference" in result.output


def test_an_archive_of_mixed_llmplay_versions_works(clones, tmp_path):
    root = copy_of(clones, tmp_path)
    runs, _ = runs_with_warnings(root)
    old = root / runs[2].path
    manifest = json.loads((old / MANIFEST).read_text())
    manifest["environment"]["llmplay_version"] = "0.0.9"
    for trial in manifest["trials"]:  # an older llmplay recorded neither the engine nor these figures
        trial.pop("engine_describe")
        trial["summary"].pop("cost.usd_per_1m_tokens")
    from llmplay.archive.verify import manifest_sha256

    manifest["manifest_sha256"] = manifest_sha256(manifest)
    (old / MANIFEST).write_text(json.dumps(manifest))
    runs, _ = runs_with_warnings(root)
    history = build_history(PLAYBOOK_NAME, runs, None)
    assert runs[2].llmplay_version == "0.0.9" and runs[2].usable
    assert "cost.usd_per_1m_tokens" not in history.rows[2].figures and "ttft.p95" in history.rows[2].figures
    assert "llmplay 0.0.9" in format_history(history)


def test_a_run_archived_before_a_setting_existed_stays_in_its_series(clones, tmp_path):
    root = copy_of(clones, tmp_path)
    runs, _ = runs_with_warnings(root)
    old = root / runs[2].path
    manifest = json.loads((old / MANIFEST).read_text())
    for config in manifest["configs"]:  # an older llmplay knew none of these: its workloads had them at their default
        for setting in ("think_time", "trace", "session_header"):
            config["workload"].pop(setting)
    from llmplay.archive.verify import manifest_sha256

    manifest["manifest_sha256"] = manifest_sha256(manifest)
    (old / MANIFEST).write_text(json.dumps(manifest))
    runs, _ = runs_with_warnings(root)
    assert runs[2].usable and runs[2].config_fingerprint == runs[1].config_fingerprint == runs[3].config_fingerprint
    history = build_history(PLAYBOOK_NAME, runs, None)
    assert not any(m.startswith("configuration changed") for row in history.rows for m in row.marks)


# ---------------------------------------------------------------------------------------------- accept and check
@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """Three real-shaped runs of one playbook (per-request records): a reference, a repeat, a slower one."""
    base = tmp_path_factory.mktemp("check")
    runs = []
    for seed, slowdown in ((7, 1.0), (11, 1.0), (7, 1.8)):
        runs.append(make_archive(base, seed=seed, slowdown=slowdown))
        time.sleep(1.1)  # run ids are UTC seconds: keep them in the order made
    return base / "reports", runs


def history_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["history", *args])
    return result.exit_code, result.output


def test_check_against_the_accepted_reference(checked, tmp_path):
    root = copy_of(checked[0], tmp_path)
    reference, repeat, slower = checked[1]
    code, output = history_cli("--check", "--archive", str(root))
    assert code == ExitCode.INFRA and "history --accept" in output
    code, output = history_cli("synthetic-tune", "--accept", reference.name, "--archive", str(root))
    assert code == 0 and f"accepted {reference.name} as the reference of synthetic-tune" in output
    assert json.loads((root / "synthetic-tune" / "reference.json").read_text())["run_id"] == reference.name
    shutil.rmtree(root / "synthetic-tune" / slower.name)  # the newest is now a repeat of the reference
    code, output = history_cli("--check", "--archive", str(root))
    assert code == ExitCode.OK, output
    assert f"no regression of {repeat.name} against the reference {reference.name}" in output
    shutil.copytree(slower, root / "synthetic-tune" / slower.name)  # a run made worse on purpose
    code, output = history_cli("--check", "--archive", str(root))
    assert code == ExitCode.REGRESSION, output
    assert f"REGRESSION of {slower.name} against the reference {reference.name}" in output
    assert "objective output tokens/s" in output and "beyond its 5% tolerance" in output


# ---------------------------------------------------------------------------------------------- the site
class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.ids: set[str] = set()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("href", "src", "xlink:href", "action", "data", "poster") and value:
                self.urls.append(value)
            if name == "id" and value:
                self.ids.add(value)


def assert_offline_and_linked(page: Path) -> Links:
    """Nothing from the network, no script; every link is in the page or a file that exists."""
    html = page.read_text()
    links = Links()
    links.feed(html)
    assert "script" not in links.tags and "<script" not in html.lower() and "@import" not in html
    assert "{{" not in html and "{%" not in html
    for url in links.urls:
        assert "//" not in url and not url.startswith(("http:", "https:", "data:", "file:")), url
        if url.startswith("#"):
            assert url[1:] in links.ids, url
        else:
            assert (page.parent / url).resolve().is_file(), url
    return links


def test_the_site_covers_every_playbook_offline_with_working_links(checked, clones, tmp_path):
    root = copy_of(checked[0], tmp_path)
    shutil.copytree(clones / PLAYBOOK_NAME, root / PLAYBOOK_NAME)
    reference = checked[1][0]
    assert history_cli("synthetic-tune", "--accept", reference.name, "--archive", str(root))[0] == 0
    result = write_site(root)
    assert result.path == root / "index.html" and result.playbooks == 2 and result.runs == 15
    links = assert_offline_and_linked(result.path)
    html = result.path.read_text()
    assert html.count('class="chart"') >= 5 and "accepted reference" in html
    reports = [u for u in links.urls if u.endswith("report.html")]
    compares = [u for u in links.urls if u.startswith("./compare/")]
    assert len(reports) == 3 and compares  # make_archive's runs have reports; clones have none
    for url in compares:
        assert_offline_and_linked(root / url)
    assert "regression" in html.lower()
    out = tmp_path / "elsewhere" / "site.html"
    out.parent.mkdir()
    code = CliRunner().invoke(cli, ["site", "--archive", str(root), "--out", str(out)]).exit_code
    assert code == 0
    assert_offline_and_linked(out)
    render_in_chromium(result.path)


def render_in_chromium(page: Path) -> None:
    """The page renders in headless Chromium with the network unreachable: its DOM has every section."""
    if chromium() is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("chromium is not installed (CI=true: the site must be checked in a browser)")
        pytest.skip(
            "chromium is not installed (`scripts/setup.sh --test` installs it); the site was checked without it"
        )
    dom = dom_in_chromium(page)
    assert "<h1>llmplay archive</h1>" in dom and 'id="pb-synthetic-tune"' in dom and "<svg" in dom


def test_the_ci_job_file_runs_retest_then_check():
    import yaml

    job = yaml.safe_load((Path(__file__).resolve().parents[2] / "docs/ci/nightly-retest.gitlab-ci.yml").read_text())
    script = job["nightly-engine-retest"]["script"]
    assert "llmplay retest" in " ".join(script) and "llmplay history" in script[-1]
    assert script[-1].endswith('"$PLAYBOOK" --check --noise history')
    commands = " ".join(script)
    assert commands.index("llmplay retest") < commands.index("--check")


def test_check_fails_when_the_newest_run_measured_nothing(checked, tmp_path):
    root = copy_of(checked[0], tmp_path)
    reference, repeat, slower = checked[1]
    shutil.rmtree(root / "synthetic-tune" / slower.name)
    assert history_cli("synthetic-tune", "--accept", reference.name, "--archive", str(root))[0] == 0
    newest = root / "synthetic-tune" / repeat.name
    manifest = json.loads((newest / MANIFEST).read_text())
    for trial in manifest["trials"]:  # every trial failed: the engine never served
        trial["status"] = "failed"
    from llmplay.archive.verify import manifest_sha256

    manifest["manifest_sha256"] = manifest_sha256(manifest)
    (newest / MANIFEST).write_text(json.dumps(manifest))
    code, output = history_cli("--check", "--archive", str(root))
    assert code == ExitCode.UNJUDGED and f"NOT MEASURED: the newest run {repeat.name}" in output


def test_a_read_only_archive_is_indexed_in_memory(clones, tmp_path, monkeypatch):
    root = copy_of(clones, tmp_path)
    (root / INDEX_FILE).unlink(missing_ok=True)
    import llmplay.archive.atomic as atomic_module

    def refused(*args, **kwargs):  # what a directory this user may not write to answers (root may write anywhere)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(atomic_module.tempfile, "mkstemp", refused)  # where the index file is made
    runs, warnings = runs_with_warnings(root)
    assert len(runs) == 12 and "indexing the manifests in memory for this command" in warnings[-1]
    assert not (root / INDEX_FILE).exists()


def keep_one_trial(run_dir: Path) -> None:
    """Tonight's run as a nightly job with one trial would archive it (the manifest re-hashed: it verifies)."""
    from llmplay.archive.verify import manifest_sha256

    manifest = json.loads((run_dir / MANIFEST).read_text())
    manifest["trials"] = manifest["trials"][:1]
    manifest["manifest_sha256"] = manifest_sha256(manifest)
    (run_dir / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize(("upgrade", "judged_code"), [(True, ExitCode.REGRESSION), (False, ExitCode.OK)])
def test_a_one_trial_run_is_not_judged_on_its_trials_and_is_judged_against_the_history(tmp_path, upgrade, judged_code):
    """One trial tonight: no interval from the two runs' trials, so never "no regression" (exit 5, saying why);
    against five earlier runs of the reference's build (--noise history) the same trial is judged: the upgrade's
    +60% P95 TTFT is shown beyond the 10% min_effect, a repeat of the reference build is not."""
    root = tmp_path / "reports"
    runs = make_history_archive(root, 7, upgrade_at=6 if upgrade else 99)
    keep_one_trial(runs[-1])
    assert history_cli(PLAYBOOK_NAME, "--accept", runs[0].name, "--archive", str(root))[0] == 0
    code, output = history_cli(PLAYBOOK_NAME, "--check", "--archive", str(root))
    assert code == ExitCode.UNJUDGED, output
    assert "NOT JUDGED" in output and "too few trials: the reference has 3 and the newest run 1" in output
    assert "no regression" not in output
    code, output = history_cli(PLAYBOOK_NAME, "--check", "--noise", "history", "--archive", str(root))
    assert code == judged_code, output
    assert "history noise from 6 run(s) of the reference's configuration" in output
    assert "would be caught 80% of the time" in output
    if upgrade:
        assert "REGRESSION" in output and "objective P95 TTFT +" in output and "beyond its 10% tolerance" in output
