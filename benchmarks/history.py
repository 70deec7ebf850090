"""How fast the archive's history answers at scale: an archive of N runs of one playbook (default 2,000), then
(1) `llmplay index --rebuild`'s work (every manifest read once, every run verified, the goals loaded once per
distinct playbook) and (2) `history` of that playbook on the index (in step with the manifests, checked by one
stat per run), both timed in this process, and (3) the `llmplay history` command as a subprocess, start-up included.

    PYTHONPATH=. .venv/bin/python benchmarks/history.py              # 2,000 runs (about a minute to generate)
    PYTHONPATH=. .venv/bin/python benchmarks/history.py --runs 200   # quicker

The issue's target: history over 2,000 runs in at most 1 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llmplay.archive.index import ArchiveIndex
from llmplay.history.timeline import build_history, format_history
from llmplay_testing.history_archive import PLAYBOOK_NAME, make_history_archive

TARGET_S = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmplay-history-") as tmp:
        root = Path(tmp) / "reports"
        started = time.perf_counter()
        make_history_archive(root, args.runs)
        print(f"generated {args.runs} runs in {time.perf_counter() - started:.1f} s")
        index = ArchiveIndex(root)
        started = time.perf_counter()
        count = index.rebuild()
        rebuild_s = time.perf_counter() - started
        print(f"rebuild: {count} manifests read once each, verified and indexed in {rebuild_s:.2f} s")
        started = time.perf_counter()
        history = build_history(PLAYBOOK_NAME, index.runs(PLAYBOOK_NAME), None)
        text = format_history(history)
        history_s = time.perf_counter() - started
        flags = history.flags
        print(
            f"history: {len(history.rows)} runs, {len(flags)} change(s) flagged, {len(text) // 1024} KiB of text "
            f"in {history_s:.3f} s (target <= {TARGET_S:g} s: {'met' if history_s <= TARGET_S else 'MISSED'})"
        )
        for flag in flags[:3]:
            print(f"  {flag.text()}")
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "llmplay", "history", PLAYBOOK_NAME, "--archive", str(root)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        cli_s = time.perf_counter() - started
        print(
            f"`llmplay history` as a command (interpreter start-up and imports included): {cli_s:.2f} s, rc {done.returncode}"
        )
    return 0 if history_s <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
