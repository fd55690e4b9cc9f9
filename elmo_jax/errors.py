"""The exceptions elmo-jax raises on purpose: every one is an `ElmoJaxError`,
and a `UserError` is a mistake of the user's (a path, a setting, a file) that
the commands print as one line, without a traceback."""


class ElmoJaxError(Exception):
    """An error elmo-jax raises on purpose."""


class UserError(ElmoJaxError):
    """The user's mistake or the world's (a bad path, a missing bucket): the
    message says what is wrong and what to do."""
