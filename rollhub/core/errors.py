"""Exceptions a user can cause.

The CLI turns a `UserError` into one line on stderr and exit code 2; anything else is a bug
and keeps its traceback. Raise `UserError` for bad ids, bad config, missing files or missing
optional extras, always with the fix in the message.
"""


class UserError(Exception):
    """A mistake in input or configuration, reported without a traceback."""


class MissingExtraError(UserError):
    """An optional dependency group is not installed."""

    def __init__(self, extra: str, what: str):
        super().__init__(f"{what} needs the '{extra}' extra: pip install -e '.[{extra}]'")
        self.extra = extra
