"""The exceptions elmo-jax raises on purpose: every one is an `ElmoJaxError`,
and a `UserError` is a mistake of the user's (a path, a setting, a file) that
the commands print as one line, without a traceback. Each module's own error
(`ConfigError`, `WeightsError`, ...) is a `UserError` and keeps the builtin
base it always had (ValueError, OSError, ...), so `except ValueError` in a
caller's code still catches it. Anything else raised is a bug and keeps its
traceback."""


class ElmoJaxError(Exception):
    """An error elmo-jax raises on purpose."""


class UserError(ElmoJaxError):
    """The user's mistake or the world's (a bad path, a missing bucket): the
    message says what is wrong and what to do."""


class MissingFile(UserError, FileNotFoundError):
    """A file or folder the user named (or that a command needs) is not there;
    the message says which and how to make it."""


class PathError(UserError, ValueError):
    """A path elmo-jax cannot open: an unknown scheme, a malformed bucket path,
    a client library that is not installed."""


class StorageError(UserError, OSError):
    """Remote storage refused or failed: no such bucket, no permission, no
    credentials, the service unreachable; the message says what to do.
    `transient`: the service failed (it may answer again: `retry` waits)."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient
