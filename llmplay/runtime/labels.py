"""The labels llmplay puts on every engine it starts: the one spelling of each key, shared by runtimes, gc and
tests without loading the docker SDK."""

from __future__ import annotations

LABEL_RUN = "llmplay.run"
LABEL_TRIAL = "llmplay.trial"
LABEL_INSTANCE = "llmplay.instance"  # unique per start, to find a container whose start failed
# The llmplay process that owns it: pid, host and that process's start time name it (a pid alone may be recycled),
# so gc can tell an orphan from a container of a run still going.
LABEL_PID = "llmplay.pid"
LABEL_HOST = "llmplay.host"
LABEL_PID_STARTED = "llmplay.pid_started"
LABEL_CONFIG = "llmplay.config"
LABEL_ENGINE = "llmplay.engine"
