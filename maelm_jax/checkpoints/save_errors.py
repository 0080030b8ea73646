"""How a failed save stops a run: the errors it raises, and the echoes of one kept quiet."""

import logging as logging_lib
import sys
import traceback

_ORBAX_SOURCE = "/orbax/checkpoint/"


class CheckpointSaveError(RuntimeError):
    """An asynchronous save failed; the run must stop rather than go on unprotected."""


class NonFiniteStateError(CheckpointSaveError):
    """The state due for a checkpoint holds NaN/inf: saving it would poison every rerun."""


def _is_echo_of_failed_write(exc: BaseException | None, tb) -> bool:
    return (
        isinstance(exc, RuntimeError)
        and str(exc) == "Event loop is closed"
        and any(frame.name == "call_soon_threadsafe" for frame in traceback.extract_tb(tb))
    )


class _DropUnretrievedOrbaxErrors(logging_lib.Filter):
    def filter(self, record: logging_lib.LogRecord) -> bool:
        if "exception was never retrieved" not in record.getMessage() or not record.exc_info:
            return True
        frames = traceback.extract_tb(record.exc_info[2])
        return not any(_ORBAX_SOURCE in frame.filename for frame in frames)


class _OrbaxErrorsOnOneLine(logging_lib.Filter):
    """Orbax logs each failed background write, and each thread that waited on it, with its
    traceback (`logging.exception`): five or more tracebacks for one full disk. The record
    stays, as one line that ends with the exception's own first line."""

    def filter(self, record: logging_lib.LogRecord) -> bool:
        if record.exc_info and _ORBAX_SOURCE in record.pathname:
            message, error = record.getMessage(), record.exc_info[1]
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            if reason and reason not in message:
                message = f"{message} ({type(error).__name__}: {reason})"
            record.msg, record.args = message, None
            record.exc_info = record.exc_text = None
        return True


def silence_writes_after_a_failed_save() -> None:
    """Keeps a failed save's echoes and tracebacks off stderr (call from `main`).

    When one of a save's writes fails (a full disk, say), Orbax stops awaiting the others:
    asyncio then logs each of their failures as "... exception was never retrieved", and
    TensorStore, finishing writes for an event loop Orbax has closed, reports each failed
    `loop.call_soon_threadsafe` through `sys.unraisablehook`. That is hundreds of
    tracebacks, printed from other threads, which bury and can split the one line saying
    what went wrong. The failure itself still reaches the main thread through
    `Checkpointer.check_for_errors`, and Orbax's own error lines stay, without their
    tracebacks (a full disk or a read-only directory is no bug to debug); only the echoes go.
    """
    logging_lib.getLogger("asyncio").addFilter(_DropUnretrievedOrbaxErrors())
    logging_lib.getLogger("absl").addFilter(_OrbaxErrorsOnOneLine())  # Orbax logs through absl
    previous = sys.unraisablehook

    def hook(unraisable):
        if not _is_echo_of_failed_write(unraisable.exc_value, unraisable.exc_traceback):
            previous(unraisable)

    sys.unraisablehook = hook
