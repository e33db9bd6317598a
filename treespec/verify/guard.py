"""What a tree verify holds while it runs: its turn, and the caches' state.

Turns: a verify swaps modules on the model's instances (each attention's
rope, each recurrent mixer, a recorder around it) for one forward. Another
thread calling the same model meanwhile meets those stand-ins; each behaves
as the module it replaced in every thread but the one that installed it
(treespec.verify.attention, treespec.verify.tree_recurrence, treespec.rollback),
so a plain forward elsewhere is the plain forward. Two tree verifies of one
model cannot share the swapped modules at all, so every verify, commit and
model check takes :data:`TURN`, one process-wide reentrant lock, for the
Python part of its work (building the graph and putting the modules back;
the caller evaluates the logits after the lock is released).

Faults: :func:`restored_on_error`, entered before a verify's forward (its
refusals come earlier and write nothing), holds every cache's state
(``treespec.caches.hold``: no data copied) and puts it back if the
forward raises, wherever in it (a layer, a mask, a mixer, the injection's
probe), so every offset, array, ring and recurrent slot is what it was and a
retry is the same verify. The cache writes are only built there, never
evaluated, so nothing is lost by dropping them. A failure while evaluating
the returned logits later (out of memory, a kernel error) is not covered:
the caches then hold the verify's unevaluated writes.
"""

import functools
import threading
from contextlib import contextmanager
from typing import Sequence

from .. import caches


class Turn:
    """A reentrant lock that counts the threads waiting for it (the suite
    reads ``waiting()`` to know a thread is held here, without timing)."""

    def __init__(self):
        self._lock = threading.RLock()
        self._counting = threading.Lock()
        self._waiting = 0

    def waiting(self) -> int:
        return self._waiting

    def __enter__(self):
        if not self._lock.acquire(blocking=False):
            with self._counting:
                self._waiting += 1
            try:
                self._lock.acquire()
            finally:
                with self._counting:
                    self._waiting -= 1
        return self

    def __exit__(self, *exc):
        self._lock.release()


TURN = Turn()


def taking_turns(method):
    """``method`` run holding :data:`TURN`."""

    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        with TURN:
            return method(*args, **kwargs)

    return wrapped


@contextmanager
def restored_on_error(cache: Sequence):
    """Every cache in ``cache`` put back as it is now if the block raises."""
    held = caches.hold(cache)
    try:
        yield
    except BaseException:
        caches.put_back(held)
        raise
