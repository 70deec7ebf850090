"""How a tuning run stops: SIGINT/SIGTERM handling, and the exceptions that carry a run or a trial out early."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

import pandas as pd

from llmplay.archive.model import TrialRecord
from llmplay.errors import ExitCode


class StopRun(Exception):
    """The playbook asked the run to stop (a failed trial with `on_failure: stop`)."""


class TrialInterrupted(BaseException):
    """Carries a trial cut short by a signal out of the engine's context (which stops the engine) to the archive."""

    def __init__(self, trial: TrialRecord, records: pd.DataFrame | None, log: str):
        super().__init__(trial.error)
        self.trial, self.records, self.log = trial, records, log


class SignalGuard:
    """First SIGINT/SIGTERM unwinds (engines stop in their finally); a second forces it.

    The first signal's KeyboardInterrupt lands wherever the main thread happens to be; should a library
    swallow it there, a watchdog stops every engine and exits anyway, so a signal can never leave an
    engine holding GPUs.
    """

    FORCE_AFTER_S = 30.0

    def __init__(self, stop_all: Callable[[], None]):
        self.stop_all = stop_all
        self.count = 0
        self.previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}

    def _force(self) -> None:
        self.stop_all()
        os._exit(ExitCode.INTERRUPTED)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count > 1:
            self._force()
        watchdog = threading.Timer(self.FORCE_AFTER_S, self._force)
        watchdog.daemon = True
        watchdog.start()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            raise KeyboardInterrupt(f"signal {signum}")
        # Inside the load generator's event loop an exception raised here would land in some protocol
        # callback, which the loop logs and swallows; cancelling its tasks unwinds it the asyncio way.
        for task in asyncio.all_tasks(loop):
            task.cancel()

    def check(self) -> None:
        """Between trials: an interrupt that was swallowed somewhere still ends the run here."""
        if self.count:
            raise KeyboardInterrupt("signal received earlier")

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread may install handlers; the embedding program owns signals then
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
