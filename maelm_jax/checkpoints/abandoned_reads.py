"""The reads a failed Orbax restore leaves behind, ended before Python reports them.

Orbax runs a restore's array reads as the tasks of one `asyncio.gather`, on an event loop
that `asyncio_utils.run_sync` closes without cancelling what is left. When one read fails
(an array file damaged on disk), the reads still in flight are abandoned; whenever Python
collects them, each turns the `GeneratorExit` into an exception quoting TensorStore's whole
spec, printed as "Exception ignored in: <coroutine object _read_array_index_and_device_put
...>" with some 30 lines of traceback. After a restore that was recovered from, that reads
as a crash. `ended_on_failure` closes those tasks as the failure surfaces.
"""

import asyncio
import contextlib
import gc
import sys

_ORBAX_SOURCE = "/orbax/checkpoint/"


def _orbax_coroutine(obj) -> bool:
    code = getattr(obj, "cr_code", None)
    return code is not None and _ORBAX_SOURCE in code.co_filename


def _is_abandoned_read_report(unraisable) -> bool:
    """An Orbax coroutine collected unfinished, which raised instead of closing."""
    exc = unraisable.exc_value
    return _orbax_coroutine(unraisable.object) and isinstance(
        getattr(exc, "__cause__", None) or getattr(exc, "__context__", None), GeneratorExit
    )


def end_abandoned_tasks() -> int:
    """Closes the unfinished Orbax tasks of closed event loops, which can never run again;
    returns how many. What their coroutines raise on closing is the abandonment itself."""
    ended = 0
    for task in [obj for obj in gc.get_objects() if isinstance(obj, asyncio.Task)]:
        if task.done() or not task.get_loop().is_closed():
            continue
        if not _orbax_coroutine(task.get_coro()):
            continue
        task._log_destroy_pending = False  # as run_until_complete does: no "was destroyed"
        with contextlib.suppress(Exception):
            task.get_coro().close()
        ended += 1
    return ended


@contextlib.contextmanager
def ended_on_failure():
    """Runs an Orbax restore; if it raises, ends the reads it abandoned, then re-raises.

    Until then, a report of such a read (collected before it could be ended) is dropped;
    every other unraisable exception goes to the hook that was there before.
    """
    previous = sys.unraisablehook

    def hook(unraisable):
        if not _is_abandoned_read_report(unraisable):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    except BaseException:
        end_abandoned_tasks()
        raise
    finally:
        if sys.unraisablehook is hook:
            sys.unraisablehook = previous
