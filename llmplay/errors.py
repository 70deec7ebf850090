"""Error classes a user can act on; the CLI maps each to a one-line message and an exit code."""
from __future__ import annotations


class LlmplayError(Exception):
    """Base for every error that is the user's to fix or the environment's; never shown as a traceback."""

    exit_code = 1


class PlaybookError(LlmplayError):
    """The playbook is invalid: message names file:line, the YAML path, what was found and expected."""

    exit_code = 2


class InfrastructureError(LlmplayError):
    """Docker, the engine, or the network failed; the run cannot go on."""

    exit_code = 1


class EngineStartError(InfrastructureError):
    """The engine container/process exited or never became healthy."""

    def __init__(self, message: str, exit_code: int | None = None, log_tail: str = ""):
        super().__init__(message)
        self.container_exit_code = exit_code
        self.log_tail = log_tail


class ArchiveError(LlmplayError):
    """An archive is missing, malformed, or fails verification."""

    exit_code = 1
