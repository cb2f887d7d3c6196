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


class RunDirError(VitlabError, OSError):
    """The run directory cannot be used as asked (it holds another run, another process writes it, or it cannot be
    written)."""


class OutputError(VitlabError, OSError):
    """A file a command would write cannot be written: it exists (and ``--force`` was not given), or the disk is
    full, or the folder is read-only."""


class MissingLibraryError(VitlabError, ImportError):
    """A feature needs an optional library (an extra of vitlab's package) that is not installed."""


class FamilyError(VitlabError, ValueError):
    """A family (a plug-in's, mostly) that is declared wrongly or cannot be imported: the family's error, not the
    user's config."""
