"""What a batch job hears of the passes of the calls it makes (:class:`PassListener`), in a
module of its own that imports neither torch nor the passes: the Ray engine's planner makes
listeners without torch (:mod:`explain.passes` uses it and exports it)."""

from __future__ import annotations

__all__ = ["PassListener"]


class PassListener:
    """What a batch job hears of the passes of the calls it makes, and how it stops them:
    given to :func:`~explain.passes.pass_settings` (``listener=``) for a block of calls. The command line's
    moves its progress bar, asks whether Ctrl-C was pressed and hands memory back to the
    system (``explain.batch.loop``). Each method here does nothing: a listener overrides
    what it needs.

    >>> class Counting(PassListener):
    ...     def __init__(self):
    ...         self.heard = []
    ...     def advanced(self, method, done, total):
    ...         self.heard.append((method, done, total))
    >>> from explain.passes import Passes, pass_settings
    >>> with pass_settings(listener=Counting()) as settings, Passes("demo", total=3) as passes:
    ...     passes.advance(2); passes.advance(1)
    >>> settings.listener.heard
    [('demo', 2, 3), ('demo', 3, 3)]
    """

    def advanced(self, method: str, done: int, total: int) -> None:
        """``done`` of the ``total`` rows of the outermost running call (of ``method``) ran:
        told after each of its inner batches."""

    #: Whether :meth:`should_stop` is also asked at every layer of the model, forward and
    #: backward: a batch job's Ctrl-C, answered within an inner batch.
    asked_at_layers: bool = False

    def should_stop(self) -> bool:
        """Whether the running call should stop: asked after each inner batch (and at each
        layer where :attr:`asked_at_layers`), True raises :class:`~explain.passes.StopRequested` there."""
        return False

    def between(self) -> None:
        """Called after each inner batch, each size :func:`~explain.passes.fastest_rows` tries and (in
        a batch job, through :func:`~explain.passes.between_passes`) each method: where the command line hands memory
        the passes freed back to the system."""
