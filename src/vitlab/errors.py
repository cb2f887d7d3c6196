"""Errors a user can fix. Each message names the problem and the fix; the CLI prints them without a traceback."""


class VitlabError(Exception):
    """Base class of every user-facing vitlab error."""

    def __str__(self) -> str:  # KeyError subclasses would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class ConfigError(VitlabError, ValueError):
    """A configuration value or key is wrong."""


class UnknownModelError(VitlabError, KeyError):
    """No registered model preset has that name."""


class ModelOptionError(VitlabError, TypeError):
    """A model preset got a constructor option it does not have."""


class CheckpointError(VitlabError, RuntimeError):
    """A checkpoint or exported model that cannot be read."""


class RunFileError(VitlabError, FileNotFoundError):
    """A file a command needs is not in the run directory (e.g. ``dynamics.jsonl`` of a run trained without it)."""
