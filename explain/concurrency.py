"""Threads: what the library does when several threads share one model, and the locks it takes.

An explanation changes the model for the length of a call: eval mode, frozen parameters,
hooks, the canonizers of LRP and Excitation Backprop (merged batch norms, replaced
forwards, added attributes), timm's
``fused_attn`` flags, randomised weights in :func:`~explain.metrics.model_randomisation`.
Two calls that did this at once on one model would see each other's hooks and restore each
other's flags (and leave the model changed for good). So every call that changes a model's
state holds that model's lock, :func:`model_lock`: calls on one model from several threads
run one after another and give the results of a serial run. The lock is re-entrant, so a
method or metric that calls another explainer on the same model goes on.

What is and is not safe:

- **Safe**: any number of threads calling explainers and metrics on one model (they take
  turns) or on different models (they run at once, apart from the process-wide parts below).
- **Taking turns process-wide**: seeded random draws (:func:`~explain.baselines.seeded` forks
  torch's and numpy's global generators, which are the process's) and the explicit attention
  kernel that :class:`~explain.attention_capture.AttentionCapture` puts in place of
  ``F.scaled_dot_product_attention`` (installed once while any capture is open, removed when
  the last one closes; other threads' attention then runs the explicit form too: the same
  values, slower).
- **Not safe**: training the model in another thread while a call runs (it is in eval mode
  with frozen parameters meanwhile, and the relevance methods' canonizers and the
  randomisation metric change its modules or weights for the call's length), or using one
  of its submodules on its own in another thread (the lock is the model's, not the
  submodule's). Plain inference in another thread during a CAM or gradient call is fine:
  the hook engine ignores forward passes that are not its own thread's; during LRP,
  Excitation Backprop or the randomisation metric it is not. Draws from torch's global
  generator in another thread during a seeded call change that call's noise.
- **For throughput** across threads, give each thread its own copy of the model
  (``copy.deepcopy(model)``): calls on one model never overlap.
"""

from __future__ import annotations

import threading
import weakref

from torch import nn

__all__ = ["model_lock", "process_lock"]

_locks: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_locks_guard = threading.Lock()

#: The lock of state that belongs to the whole process (the global random generators, the
#: attention kernel). Always taken after a model's lock, never before, so that no two
#: threads wait on each other.
process_lock = threading.RLock()


def model_lock(model: nn.Module) -> threading.RLock:
    """The re-entrant lock of ``model``: held while a call changes its state.

    >>> model = nn.Linear(2, 2)
    >>> model_lock(model) is model_lock(model)
    True
    >>> with model_lock(model), model_lock(model):    # re-entrant
    ...     pass
    """
    with _locks_guard:
        lock = _locks.get(model)
        if lock is None:
            lock = _locks[model] = threading.RLock()
        return lock
