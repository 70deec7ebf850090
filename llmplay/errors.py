"""Exit codes and the error classes a user can act on; the CLI maps each error to a one-line message and its code."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Every exit status llmplay returns; commands and the tuning run name these, never the numbers."""

    OK = 0
    INFRA = 1  # infrastructure failure, or an archive that fails verification
    PLAYBOOK = 2  # the playbook (or a command-line override) is invalid
    GATES = 3  # the run completed but its final configuration misses a gate
    REGRESSION = 4  # compare / retest: the newer run regressed
    UNJUDGED = 5  # history --check: the newest run cannot be judged (a goal not measured, too few trials)
    INTERRUPTED = 130  # SIGINT/SIGTERM; continue with --resume


class LlmplayError(Exception):
    """Base for every error that is the user's to fix or the environment's; never shown as a traceback."""

    exit_code: int = ExitCode.INFRA


class PlaybookError(LlmplayError):
    """The playbook is invalid: message names file:line, the YAML path, what was found and expected."""

    exit_code = ExitCode.PLAYBOOK


class InfrastructureError(LlmplayError):
    """Docker, the engine, or the network failed; the run cannot go on."""

    exit_code = ExitCode.INFRA


class EngineStartError(InfrastructureError):
    """The engine container/process exited or never became healthy."""

    def __init__(self, message: str, exit_code: int | None = None, log_tail: str = ""):
        super().__init__(message)
        self.container_exit_code = exit_code
        self.log_tail = log_tail


class ArchiveError(LlmplayError):
    """An archive is missing, malformed, or fails verification."""

    exit_code = ExitCode.INFRA
