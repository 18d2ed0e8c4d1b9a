"""The extra passes of the heavy methods (Score-CAM's masked images, IG's steps, LIME's
coalitions, the metrics' perturbed copies): how many rows each inner batch holds, what a
long call shows while it runs, and how it stops.

- **Rows from a memory budget.** :func:`inner_rows` sizes an inner batch so that its passes
  fit in :func:`memory_budget`: by default :data:`MEMORY_SHARE` of the memory available on
  the images' device (free RAM on the CPU, free device memory on CUDA), or ``max_memory``
  where the caller gives one. What one row costs is measured once per model, input shape
  and kind of pass (:func:`row_bytes`: the tensors autograd keeps for a backward pass, a few
  of the largest activations for a forward pass).
- **The fastest size within it.** Among the sizes the budget allows, :func:`fastest_rows`
  takes the one with the lowest time per row, measured at first use on this model, device
  and input size (powers of two, from :data:`FIRST_ROWS` up while the time per row falls) and kept for the
  process; the search spends at most :data:`SEARCH_SHARE` of a call's rows, later calls
  going on with it. On a CPU that is a small batch (the bundled EfficientNet-Lite0 at 224 px: 8),
  where a larger one leaves the caches; on a GPU, a large one.
- **Progress.** :class:`Passes` counts a call's rows: a tqdm bar once the call has run for
  :data:`BAR_DELAY` (any call of more than :data:`PROGRESS_AFTER` rows: a metric's few
  hundred passes can take minutes on a CPU; at once where ``progress=True``), and the
  :class:`~explain.pass_listener.PassListener` of :func:`pass_settings` (a batch job's: the command line's bar)
  told of each inner batch.
- **A prompt stop.** Ctrl-C raises ``KeyboardInterrupt`` between two inner batches, each a
  fraction of a second, and the call restores the model on its way out. A batch job whose
  listener asks for a stop (:meth:`~explain.pass_listener.PassListener.should_stop`) gets :class:`StopRequested` there,
  and, where the listener says so (:attr:`~explain.pass_listener.PassListener.asked_at_layers`), within an inner
  batch at the next layer of the model, forward or backward (whatever the inner batch's
  size: the memory budget's, or a loaded machine's seconds).

Every explainer's call and every metric take ``max_memory=`` and ``progress=``; a block of
calls takes them from :func:`pass_settings`::

    cam(images, max_memory="2GB", progress=True)
    with pass_settings(max_memory="1GB", progress=False):
        deletion(model, images, explanation)
"""

from __future__ import annotations

import contextvars
import functools
import math
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from .options import parse_memory
from .pass_listener import PassListener

__all__ = [
    "MEMORY_SHARE",
    "PROGRESS_AFTER",
    "PassListener",
    "Passes",
    "StopRequested",
    "advance",
    "available_memory",
    "between_passes",
    "budget_rows",
    "call_settings",
    "fastest_rows",
    "inner_rows",
    "memory_budget",
    "parse_memory",
    "pass_settings",
    "row_bytes",
    "timed_chunks",
    "with_pass_options",
]

#: The share of the available memory that a call's inner batches may take by default.
MEMORY_SHARE = 0.5
#: Calls that run more rows than this through the model show a progress bar by default, once
#: they have run :data:`BAR_DELAY`: whether a call is long depends on the model and the device
#: more than on its rows (deletion and insertion of one photo, 2 x 225 passes of the bundled
#: model, took 2.5 minutes on a busy 2-core CPU), so every call of more than one row may show one.
PROGRESS_AFTER = 1
#: Seconds a call runs before its default progress bar shows: a long call's, not a flash.
BAR_DELAY = 1.0
#: On the CPU, inner batches stop at this many bytes (within the budget): the search for the
#: fastest batch tries no larger one. Past the caches, larger batches cost memory and gain
#: little: the bundled model's forward per image takes 18, 15 and 18 ms at 8, 16 and 32 rows
#: (16 rows: 0.37 GB), its forward+backward 50, 43 and 52 ms at 4, 8 and 16 (4 rows: 0.44
#: GB, 8: 0.89 GB). At this size every method of ``explain run --method all`` on two photos
#: stays under 2 GB; a backward pass runs at 4 rows where 8 would be 13 % faster.
CPU_BATCH_BYTES = 5 * 10**8
#: The first size the search for the fastest batch tries. The time per row falls steeply over
#: the first sizes (the bundled model's forward+backward on a CPU: 95, 73, 50 and 43 ms per
#: image at 1, 2, 4 and 8 rows; resnet50's 185, 138, 112 and 100 ms), so trying 1 and 2 would
#: cost a short call time and tell it nothing.
FIRST_ROWS = 4
#: The share of a call's rows that the search for the fastest batch may spend in that call.
SEARCH_SHARE = 0.125
#: The largest inner batch :func:`fastest_rows` tries.
LARGEST_ROWS = 256
#: A probe pass that takes longer than this ends the search: larger batches would gain
#: little, and the search itself would cost more than it saves.
PROBE_SECONDS = 0.5
#: The longest inner batch :func:`timed_chunks` grows to: Ctrl-C waits for the batch it
#: lands in.
LONGEST_PASS = 1.0
#: Bytes of the method's own per-row tensors (masks, scaled inputs, gradients), in inputs.
INPUT_COPIES = 4


class StopRequested(KeyboardInterrupt):
    """A batch job asked the call to stop (its first Ctrl-C): raised between two inner
    batches, like the ``KeyboardInterrupt`` it is."""


@dataclass(frozen=True)
class Settings:
    """What :func:`pass_settings` sets for the calls in its block."""

    max_memory: int | None = None
    progress: bool | None = None
    #: What a batch job hears of the passes (None: nothing hears them).
    listener: PassListener | None = None


_settings: contextvars.ContextVar[Settings] = contextvars.ContextVar("explain_pass_settings", default=Settings())
_running: contextvars.ContextVar[Passes | None] = contextvars.ContextVar("explain_running_passes", default=None)
_label: contextvars.ContextVar[str] = contextvars.ContextVar("explain_pass_label", default="passes")
_UNSET = object()


@contextmanager
def pass_settings(*, max_memory=_UNSET, progress=_UNSET, listener=_UNSET) -> Iterator[Settings]:
    """Set, for the calls in the block (in this thread), the memory budget of their inner
    batches (``max_memory``, see :func:`~explain.options.parse_memory`), whether they show a
    progress bar (``progress``: None for the default) and the :class:`~explain.pass_listener.PassListener` that hears
    of their inner batches and may stop them; what is not given stays as it was.

    >>> with pass_settings(max_memory="1GB"):
    ...     memory_budget(torch.device("cpu"))
    1000000000
    """
    changes: dict[str, Any] = {}
    if max_memory is not _UNSET:
        changes["max_memory"] = parse_memory(max_memory)
    if progress is not _UNSET:
        if progress is not None and not isinstance(progress, bool):
            raise ValueError(f"progress must be True, False or None (a bar for long calls), got {progress!r}")
        changes["progress"] = progress
    if listener is not _UNSET:
        if listener is not None and not isinstance(listener, PassListener):
            raise TypeError(f"listener must be an explain.passes.PassListener or None, got {type(listener).__name__}")
        changes["listener"] = listener
    token = _settings.set(replace(_settings.get(), **changes))
    try:
        yield _settings.get()
    finally:
        _settings.reset(token)


def call_settings(max_memory=None, progress=None):
    """:func:`pass_settings` of one call's own ``max_memory`` and ``progress`` arguments, those
    that are not None, over the settings in force."""
    given = {}
    if max_memory is not None:
        given["max_memory"] = max_memory
    if progress is not None:
        given["progress"] = progress
    return pass_settings(**given)


def with_pass_options(function: Callable) -> Callable:
    """Decorator of a metric: it takes ``max_memory=`` and ``progress=`` (see
    :func:`pass_settings`), and its progress bar is labelled with its name."""

    @functools.wraps(function)
    def wrapper(*args, max_memory=None, progress=None, **kwargs):
        token = _label.set(function.__name__.replace("_", "-"))
        try:
            with call_settings(max_memory, progress):
                return function(*args, **kwargs)
        finally:
            _label.reset(token)

    return wrapper


def available_memory(device: torch.device) -> int:
    """Bytes available on ``device``: free device memory on CUDA; on the CPU, the kernel's
    estimate of what can be allocated without swapping (``MemAvailable``), within the
    process's cgroup limit and its address-space limit (``ulimit -v``) where they are set."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        # What torch's allocator holds but does not use is free for this process too.
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    limits = [_meminfo_available(), _cgroup_room(), _address_space_room()]
    return min(limit for limit in limits if limit is not None)


def _meminfo_available() -> int:
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:  # other Unixes
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30  # unknown: as if on an 8 GB machine


def _address_space_room() -> int | None:
    """What the process's address-space limit (``ulimit -v``, ``RLIMIT_AS``) leaves it: the
    limit less what the process has mapped; None where there is no limit. Under such a limit
    the CPU allocator fails long before the machine's memory runs out."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return max(0, soft - int(line.split()[1]) * 1024)
    except (ImportError, OSError, ValueError):
        pass
    return None


def _cgroup_room() -> int | None:
    try:
        with open("/sys/fs/cgroup/memory.max") as limit, open("/sys/fs/cgroup/memory.current") as current:
            text = limit.read().strip()
            return None if text == "max" else max(0, int(text) - int(current.read().strip()))
    except (OSError, ValueError):
        return None


def memory_budget(device: torch.device) -> int:
    """Bytes a call's inner batches may take on ``device``: ``max_memory`` where set (see
    :func:`pass_settings`), else :data:`MEMORY_SHARE` of :func:`available_memory`."""
    given = _settings.get().max_memory
    return given if given is not None else int(MEMORY_SHARE * available_memory(device))


# -- measured once per model, input shape, dtype, device and kind of pass

_measured: weakref.WeakKeyDictionary[object, dict] = weakref.WeakKeyDictionary()
_measured_guard = threading.Lock()


def _measurements(owner: object) -> dict:
    with _measured_guard:
        return _measured.setdefault(owner, {})


def _cache(model: nn.Module, row: Tensor, backward: bool, what: str) -> tuple[dict, tuple]:
    key = (what, tuple(row.shape[1:]), row.dtype, str(row.device), backward)
    return _measurements(model), key


def _score(output) -> Tensor:
    """A scalar of every floating tensor of a model's output, to run backward from."""
    if isinstance(output, Tensor):
        return output.float().sum() if output.is_floating_point() else output.new_zeros((), dtype=torch.float32)
    values = output.values() if isinstance(output, dict) else output if isinstance(output, (list, tuple)) else ()
    parts = [_score(value) for value in values if isinstance(value, (Tensor, dict, list, tuple))]
    return torch.stack(parts).sum() if parts else torch.zeros(())


def _one_pass(model: nn.Module, rows: Tensor, backward: bool) -> None:
    if not backward:
        with torch.no_grad():
            model(rows)
        return
    with torch.enable_grad():
        rows = rows.detach().requires_grad_(True)
        score = _score(model(rows))
        if score.requires_grad:
            torch.autograd.grad(score, rows, allow_unused=True)


def row_bytes(model: nn.Module, row: Tensor, *, backward: bool) -> int:
    """Bytes one row like ``row`` (1, ...) takes in a pass through ``model``: with
    ``backward``, the tensors autograd keeps for the backward pass (the model's own weights
    and buffers apart) plus two of the largest
    for the gradients that flow back through them (backward frees the rest as it goes);
    without, four of the largest activation (what a forward pass holds at once: the input and
    output of a layer, a residual, a workspace). The method's own tensors add
    :data:`INPUT_COPIES` inputs. Measured on one pass at first use, then kept for the process."""
    cache, key = _cache(model, row, backward, "bytes")
    if key not in cache:
        saved: dict[int, int] = {}
        # The weights autograd keeps (a linear layer's, for the gradient of its input) are
        # the model's, not the row's: vgg11's first classifier weight (411 MB) once made a
        # row cost 1.6 GB and every pass one row.
        weights = {tensor.untyped_storage().data_ptr() for tensor in (*model.parameters(), *model.buffers())}

        def pack(tensor: Tensor):
            if tensor.device.type != "meta":
                pointer = tensor.untyped_storage().data_ptr()
                if pointer not in weights:
                    saved[pointer] = tensor.untyped_storage().nbytes()
            return tensor

        # Out of inference mode, where the perturbation methods and metrics call this from:
        # there autograd keeps nothing, and the measurement would be only the inputs.
        with (
            torch.inference_mode(False),
            torch.enable_grad(),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
        ):
            grown = row.detach().clone().requires_grad_(True)
            _score(model(grown))
        largest = max(saved.values(), default=0)
        kept = sum(saved.values()) + 2 * largest if backward else 4 * largest
        cache[key] = kept + INPUT_COPIES * row.numel() * row.element_size()
    return cache[key]


def fastest_rows(model: nn.Module, row: Tensor, *, backward: bool, most: int, allowance: int | None = None) -> int:
    """The inner batch, at most ``most`` rows, with the lowest time per row for passes of
    rows like ``row`` through ``model`` (forward only, or with ``backward``).

    Measured at first use: passes of :data:`FIRST_ROWS`, then 8, 16, ... copies of ``row``
    (fewer where ``most`` is smaller), after a warm-up, each size the faster of two passes,
    doubling until two sizes in a row are slower per row than the best (or a pass takes over
    :data:`PROBE_SECONDS`); kept for the process. A size the model refuses (out of memory)
    ends the search; where it refuses the first, one row at a time is the choice. The search
    spends at most ``allowance`` rows in one call (None: no limit), so that a short call pays
    little for it: it stops there with the best size found so far, and later calls search on
    from there, as does a call that allows larger batches than were tried."""
    cache, key = _cache(model, row, backward, "times")
    times: dict[int, float] = cache.setdefault(key, {})
    spent = 0
    first = size = min(FIRST_ROWS, most, LARGEST_ROWS)
    while size <= min(most, LARGEST_ROWS):
        if size not in times:
            cost = 2 * size + (0 if times else size)
            if _search_over(times) or (allowance is not None and spent + cost > allowance):
                break
            spent += cost
            batch = row.expand(size, *row.shape[1:]).contiguous()
            try:
                if not times:
                    _one_pass(model, batch, backward)  # warm-up: the first pass allocates
                times[size] = _timed(model, batch, backward) / size
                between_passes()
            except Exception:
                if size == 1:
                    raise
                # Out of device memory, or a model that takes no batch of this size: the
                # sizes that ran are the choice, or one row where none did.
                if row.device.type == "cuda":
                    torch.cuda.empty_cache()
                times[size] = math.inf  # never tried again, nor anything larger
                if size == first:
                    times[1] = _timed(model, row, backward)
                break
        size *= 2
    return _best(times, most) if times else most  # a call too short to search: all it may at once


def between_passes() -> None:
    """Tell the :class:`~explain.pass_listener.PassListener` in force, if any, that the passes are between two
    inner batches (:meth:`~explain.pass_listener.PassListener.between`): after an inner batch, a size the search
    tries, or (in a batch job) a method."""
    listener = _settings.get().listener
    if listener is not None:
        listener.between()


def _timed(model: nn.Module, batch: Tensor, backward: bool) -> float:
    """Seconds of the faster of two passes of ``batch``."""
    best = math.inf
    for _ in range(2):
        if batch.device.type == "cuda":
            torch.cuda.synchronize(batch.device)
        started = time.perf_counter()
        _one_pass(model, batch, backward)
        if batch.device.type == "cuda":
            torch.cuda.synchronize(batch.device)
        best = min(best, time.perf_counter() - started)
    return best


def _search_over(times: dict[int, float], longest: float = PROBE_SECONDS) -> bool:
    """Whether larger batches need not be tried: the last two were slower per row than the
    best by over 5 %, or the last pass took over ``longest`` seconds."""
    if math.inf in times.values():
        return True
    if len(times) < 2:
        return False
    best = min(times.values())
    last, before = sorted(times)[-1], sorted(times)[-2]
    slower = times[last] > 1.05 * best and times[before] > 1.05 * best
    return slower or times[last] * last > longest


def timed_chunks(owner: object, key: tuple, total: int, most: int) -> Iterator[int]:
    """Sizes of successive inner batches that cover ``total`` rows, at most ``most`` each,
    for a loop whose passes are not the whole model's (Ablation-CAM replays the layers after
    its target): the fastest size is measured on the loop's own batches, the time from one
    size to the next, doubling from 1 while the time per row falls, and kept for the
    process under ``owner`` (held weakly) and ``key``.

    >>> sum(timed_chunks(nn.Identity(), ("demo",), total=100, most=8))
    100
    """
    times: dict[int, float] = _measurements(owner).setdefault(("chunks", *key), {})
    done = 0
    while done < total:
        trying = 1 if not times else max(times) * 2
        searching = trying <= most and not _search_over(times, LONGEST_PASS)
        size = min(trying if searching else _best(times, most), total - done)
        started = time.perf_counter()
        yield size
        if searching and size == trying:
            times[size] = (time.perf_counter() - started) / size
        done += size


def _best(times: dict[int, float], most: int) -> int:
    allowed = {size: t for size, t in times.items() if size <= most}
    return min(allowed, key=allowed.__getitem__) if allowed else most


def budget_rows(model: nn.Module, images: Tensor, *, backward: bool, total: int) -> int:
    """How many rows like ``images[:1]`` (at most ``total``, at least one) fit in
    :func:`memory_budget`, at :func:`row_bytes` each; on the CPU, also within
    :data:`CPU_BATCH_BYTES` (where ``max_memory`` is not given)."""
    row = images[:1].detach()
    budget = memory_budget(row.device)
    if row.device.type == "cpu" and _settings.get().max_memory is None:
        budget = min(budget, CPU_BATCH_BYTES)
    return max(1, min(total, budget // row_bytes(model, row, backward=backward)))


def inner_rows(
    model: nn.Module,
    images: Tensor,
    *,
    backward: bool,
    total: int,
    given: int | None = None,
    call_rows: int | None = None,
) -> int:
    """Rows per inner batch for passes of ``total`` rows like ``images[:1]`` through
    ``model``: ``given`` where the caller set one (``batch_size=``, ``internal_batch_size=``),
    else the fastest size (:func:`fastest_rows`) among those that fit in the memory budget
    (:func:`budget_rows`), the search spending at most :data:`SEARCH_SHARE` of the call's
    rows (``call_rows``, where the call runs several such series of passes: ``total`` else).

    Call it with the model in the state the passes run in (eval mode, frozen weights: inside
    :func:`~explain.hooks.preserved_state`)."""
    if given is not None:
        return given
    most = budget_rows(model, images, backward=backward, total=total)
    if most <= 2:
        return most
    return fastest_rows(
        model, images[:1].detach(), backward=backward, most=most, allowance=int(SEARCH_SHARE * (call_rows or total))
    )


# -- progress and stops


class _LayerStops:
    """A stop asked for (:meth:`~explain.pass_listener.PassListener.should_stop`) is answered within a layer of the
    model, not after a whole inner batch (which takes seconds at a large memory budget, and
    many more on a loaded machine): while a call whose listener is
    :attr:`~explain.pass_listener.PassListener.asked_at_layers` runs its passes,
    every module of the process checks the test before its forward (a global forward
    pre-hook) and, on autograd's graph, when its output's gradient arrives in the backward
    pass (a hook on the output tensor), and raises :class:`StopRequested` there. The hooks
    are the process's while some such call runs (counted, for threads), and act only for the
    thread whose call it is; without such a listener (the library's calls) there are none."""

    def __init__(self):
        self._guard = threading.Lock()
        self._users = 0
        self._handles: list = []

    def acquire(self) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        with self._guard:
            self._users += 1
            if self._users == 1:
                self._handles = [
                    register_module_forward_pre_hook(_stop_before_layer),
                    register_module_forward_hook(_stop_in_backward),
                ]

    def release(self) -> None:
        with self._guard:
            self._users -= 1
            if self._users == 0:
                for handle in self._handles:
                    handle.remove()
                self._handles = []


_layer_stops = _LayerStops()


def _asks_at_layers(passes: Passes) -> bool:
    return passes.listener is not None and passes.listener.asked_at_layers


def _stop_before_layer(module: nn.Module, args) -> None:
    passes = _running.get()
    if passes is not None and _asks_at_layers(passes):
        passes.check_stop()


def _stop_in_backward(module: nn.Module, args, output) -> None:
    passes = _running.get()
    if passes is None or not _asks_at_layers(passes) or not torch.is_grad_enabled():
        return
    # The backward pass may run in autograd's own threads (CUDA): the call is held here.
    for tensor in output if isinstance(output, (tuple, list)) else (output,):
        if isinstance(tensor, Tensor) and tensor.requires_grad:
            tensor.register_hook(functools.partial(_stop_on_gradient, passes))


def _stop_on_gradient(passes: Passes, gradient: Tensor) -> None:
    passes.check_stop()


class Passes:
    """The rows one call runs through its model: a progress bar where the call is long (or
    ``progress=True``), the :class:`~explain.pass_listener.PassListener` of :func:`pass_settings` told of each inner
    batch and asked between them whether to stop. A call inside another's (a metric that explains
    again) reports to the outer one's bar, not a bar of its own.

    >>> with Passes("demo", total=3) as passes:
    ...     passes.advance(2); passes.advance(1)
    >>> passes.done
    3
    """

    def __init__(self, method: str | None, total: int, progress: bool | None = None):
        self.method = method or _label.get()
        self.total, self.done = max(0, int(total)), 0
        settings = _settings.get()
        wanted = settings.progress if progress is None else progress
        self.outer = _running.get()
        self.listener = settings.listener
        show = wanted if wanted is not None else self.total > PROGRESS_AFTER
        self.bar = None
        if show and self.outer is None:
            from tqdm.auto import tqdm

            # By default the bar shows once the call has run a second: a long call's, not a flash.
            self.bar = tqdm(
                total=self.total,
                desc=self.method,
                unit="pass",
                file=sys.stderr,
                dynamic_ncols=True,
                leave=False,
                delay=0.0 if wanted else BAR_DELAY,
            )
        self._token: contextvars.Token[Passes | None] | None = None
        #: Whether the listener's stop test is asked at every layer, forward and backward.
        self.stops_in_layers = self.outer is None and self.listener is not None and self.listener.asked_at_layers

    def __enter__(self) -> Passes:
        self._token = _running.set(self)
        if self.stops_in_layers:
            _layer_stops.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        if self.stops_in_layers:
            _layer_stops.release()
        if self._token is not None:
            _running.reset(self._token)
        if self.bar is not None:
            self.bar.close()

    def check_stop(self) -> None:
        """Raise :class:`StopRequested` where the listener of :func:`pass_settings` asks for a stop."""
        if self.listener is not None and self.listener.should_stop():
            raise StopRequested(f"{self.method}: stopped after {self.done} of {self.total} passes")

    def advance(self, rows: int) -> None:
        """``rows`` more rows ran; raise :class:`StopRequested` where a stop was asked for."""
        self.done += rows
        if self.bar is not None:
            self.bar.update(rows)
        if self.outer is None and self.listener is not None:
            self.listener.advanced(self.method, self.done, max(self.total, self.done))
        between_passes()
        self.check_stop()


def advance(rows: int) -> None:
    """Tell the running call's :class:`Passes` (if any) that ``rows`` more rows ran."""
    passes = _running.get()
    if passes is not None:
        passes.advance(rows)
