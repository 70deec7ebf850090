"""The builds `scripts/setup.sh --test --builds-in-background` leaves running (what `.ci/run` does, so that the tests
start while the vLLM images build and the upgrade tests' llama.cpp releases compile): a test that needs one waits
here until it has ended, and fails with the end of its log if it failed.

Each build says how it stands in `<cache>/builds/<name>.state`, one line replaced whole (written, then renamed):
`waiting PID LOG` while queued or building, `ok LOG` or `failed LOG` once ended. No state file: nothing is building
in the background (set-up waited for it, or never started it), and the test goes on as before.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from llmplay.runtime.cache import default_cache_dir

# The longest a test waits for one build: the vLLM images take 5 minutes each from an empty cache on 2 cores, the
# llama.cpp compiles about as long, and beside the tests all of them take longer.
WAIT_LIMIT_S = 40 * 60
POLL_S = 2.0


class BackgroundBuildFailed(RuntimeError):
    """A background build ended in failure, stopped without saying how, or outlasted WAIT_LIMIT_S."""


def vllm_build(version: str) -> str:
    return f"vllm-cpu-{version}"


def llamacpp_build(version: str) -> str:
    return f"llama-cpp-python-{version}"


def state_path(name: str, cache: Path | None = None) -> Path:
    return (cache or default_cache_dir()) / "builds" / f"{name}.state"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _log_tail(log: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(log).read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(its log {log} could not be read: {exc})"


def wait_for_background_build(name: str, *, limit_s: float = WAIT_LIMIT_S, cache: Path | None = None) -> float:
    """Wait until background build `name` has ended; the seconds waited. Raises BackgroundBuildFailed if it failed,
    stopped without a word or outlasted `limit_s`."""
    path = state_path(name, cache)
    started = time.monotonic()
    while True:
        try:
            words = path.read_text().split()
        except FileNotFoundError:
            return 0.0
        state, rest = (words[0], words[1:]) if words else ("", [])
        if state == "ok":
            return time.monotonic() - started
        if state == "failed":
            log = rest[0] if rest else "?"
            raise BackgroundBuildFailed(f"the background build {name} failed; the end of {log}:\n{_log_tail(log)}")
        if state != "waiting" or not rest or not rest[0].isdigit():
            raise BackgroundBuildFailed(f"{path}: expected 'waiting PID LOG', 'ok LOG' or 'failed LOG', got {words}")
        pid, log = int(rest[0]), rest[1] if len(rest) > 1 else "?"
        if not _alive(pid):
            # Its last word may have landed between the read above and this check.
            if path.read_text().split()[:1] == ["waiting"]:
                raise BackgroundBuildFailed(
                    f"the background build {name} (pid {pid}) stopped without ending; the end of {log}:\n"
                    f"{_log_tail(log)}"
                )
            continue
        if time.monotonic() - started > limit_s:
            raise BackgroundBuildFailed(f"the background build {name} did not end within {limit_s:.0f}s; see {log}")
        time.sleep(POLL_S)
