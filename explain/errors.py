"""The library's own error for a mistake in what it was asked to do."""


class UsageError(Exception):
    """A mistake in the options; the message says how to fix it."""
