"""Errors a user can fix. The CLI prints them as one line and exits 2, without a traceback."""


class UserError(Exception):
    """Bad input from the user: a path, a config value, a checkpoint. The message names the thing and
    what was expected."""
