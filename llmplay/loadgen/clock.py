"""The load generator's one clock: every timestamp in a RequestRecord comes from it, so all are comparable."""

from __future__ import annotations

import time

now_ns = time.perf_counter_ns
