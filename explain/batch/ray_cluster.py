"""Ray for the batch jobs: the module (or the error that names the extra to install) and the
cluster joined or started, with Ray Data set for a job's stream (no bars of its own, small
blocks, a lost block failing its images rather than the run). Driver-side: no torch."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import Option, UsageError
from .guards import terminated_as_interrupt

#: Ray Data's block size for a job: a decoded batch (16 images at 224 px: 2.4 MB) is passed
#: on at once instead of gathered with the rest of its file, so that results reach the driver
#: as images finish.
BLOCK_BYTES = 1 << 20


def import_ray():
    """The ``ray`` module, or a usage error that names the extra to install."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise UsageError(
            Option("engine"), " ray needs Ray Data: pip install 'explain-vision[ray]' (or pip install 'ray[data]')"
        ) from None
    return ray


def connect(ray, address: str | None) -> bool:
    """Join the cluster at ``address``, or start a local Ray on this machine's cores; True when
    this call started Ray (and should shut it down)."""
    import logging

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    data = ray.data.DataContext.get_current()
    data.enable_progress_bars = False  # ours counts images, not blocks
    data.print_on_execution_start = False
    data.target_max_block_size = BLOCK_BYTES
    data.max_errored_blocks = -1  # a batch Ray itself loses fails its images; the run goes on
    if ray.is_initialized():
        return False
    # Ray's notes at start and end (token authentication, "execution finished") are not the
    # user's business; its warnings about the run are, and workers' errors reach the driver.
    options = dict(logging_level=logging.ERROR, include_dashboard=False, log_to_driver=True)
    try:
        if address:
            ray.init(address=address, **options)
        else:
            ray.init(num_cpus=os.cpu_count() or 1, **options)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise UsageError(
            f"cannot {'join the Ray cluster at ' + address if address else 'start Ray'}: {error}; check ",
            Option("address"),
            " (auto, ray://HEAD:10001) and that `ray status` answers there",
        ) from None
    return True


@contextmanager
def ray_session(ray, address: str | None) -> Iterator[None]:
    """The block on the cluster at ``address`` (or a local Ray, shut down at its end), in which
    SIGTERM stops the job as Ctrl-C does: ray.init's own SIGTERM handlers (``sys.exit``, and
    the core worker's, which prints a native stack) give way to ours."""
    started = connect(ray, address)
    with terminated_as_interrupt():
        try:
            yield
        finally:
            if started:
                ray.shutdown()
