"""Errors that the command line reports as usage mistakes (exit code 2)."""

__all__ = ["UsageError"]


class UsageError(Exception):
    """A mistake in the options; the message says how to fix it."""
