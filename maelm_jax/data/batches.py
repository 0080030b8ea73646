"""Step-addressed batches: the batch for step s is a pure function of (seed, process_index,
step), so resuming at step s costs nothing and replays exactly what an uninterrupted run
would have seen; a thread prepares the next ones while the device trains on this one."""

import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from maelm_jax.config.run_config import ConfigError
from maelm_jax.data.tokenizer import PAD_ID


class Prefetcher:
    """Iterates `fn(start), fn(start + 1), ...` computed up to `depth` ahead on a thread.

    An exception in `fn` is raised by the `next` that would have returned its value. `close`
    (or leaving a `with` block, or dropping the iterator) stops the thread; it is a daemon
    and holds no reference to the iterator, so a forgotten one never keeps anything alive.
    """

    def __init__(self, fn: Callable[[int], Any], start: int = 0, depth: int = 2):
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=_produce, args=(fn, start, self._queue, self._stop), daemon=True
        )
        self._thread.start()

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        ok, value = self._queue.get()
        if not ok:
            self.close()
            raise value
        return value

    def close(self) -> None:
        self._done = True
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)  # None when __init__ failed
        if stop is not None:
            stop.set()


def _produce(fn: Callable[[int], Any], step: int, out: queue.Queue, stop: threading.Event):
    """The prefetch thread: puts (True, fn(step)) per step, or (False, error) and ends."""
    while not stop.is_set():
        try:
            item = (True, fn(step))
        except Exception as e:  # re-raised by the consumer's `next`
            item = (False, e)
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                break
            except queue.Full:
                continue
        if not item[0]:
            return
        step += 1


def stream_position(
    step: int, batch_size: int, num_blocks: int, seed: int, process_index: int
) -> dict[str, int]:
    """Where step `step` starts in one process's block stream; a checkpoint stores it so a
    resumed run can tell whether its input pipeline is the one that was interrupted."""
    epoch, position = divmod(step * batch_size, num_blocks)
    return {
        "step": step,
        "epoch": epoch,
        "position_in_epoch": position,
        "blocks": num_blocks,
        "batch_size": batch_size,
        "seed": seed,
        "process_index": process_index,
    }


class TrainBatches:
    """The training batches of one process: `batch(step)` is a pure function of
    (seed, process_index, step), so any step is produced directly, with no replay.

    The process's blocks are visited epoch by epoch, each epoch in its own permutation
    (seeded by (seed, process_index, epoch)); step s takes rows [s*b, (s+1)*b) of that
    endless stream, crossing an epoch boundary where it falls inside a batch.
    """

    def __init__(self, blocks: np.ndarray, batch_size: int, seed: int, process_index: int):
        if len(blocks) == 0:
            raise ValueError("TrainBatches needs at least one block")
        if seed < 0:
            raise ConfigError(f"seed={seed} is not allowed; it must be >= 0")
        self.blocks = blocks
        self.batch_size = batch_size
        self.seed = seed
        self.process_index = process_index
        self._lock = threading.Lock()
        self._permutations: dict[int, np.ndarray] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def _permutation(self, epoch: int) -> np.ndarray:
        with self._lock:
            if epoch not in self._permutations:
                rng = np.random.default_rng([self.seed, self.process_index, epoch])
                if len(self._permutations) >= 2:  # batches move forward: keep the latest two
                    del self._permutations[min(self._permutations)]
                self._permutations[epoch] = rng.permutation(self.num_blocks)
            return self._permutations[epoch]

    def batch(self, step: int) -> np.ndarray:
        """int32 (batch_size, seq_len): this process's rows of the global batch for `step`."""
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        positions = step * self.batch_size + np.arange(self.batch_size)
        epochs, offsets = np.divmod(positions, self.num_blocks)
        rows = np.empty(self.batch_size, np.int64)
        for epoch in np.unique(epochs):
            at = epochs == epoch
            rows[at] = self._permutation(int(epoch))[offsets[at]]
        return np.asarray(self.blocks[rows], np.int32)

    def state(self, step: int) -> dict[str, int]:
        """Where step `step` starts in this process's block stream."""
        return stream_position(
            step, self.batch_size, self.num_blocks, self.seed, self.process_index
        )

    def iterate(self, start_step: int = 0, prefetch: int = 2) -> Prefetcher:
        """batch(start_step), batch(start_step + 1), ... prepared `prefetch` ahead."""
        return Prefetcher(self.batch, start_step, prefetch)


def eval_batches(blocks: np.ndarray, num_batches: int, batch_size: int) -> list[np.ndarray]:
    """`num_batches` int32 (batch_size, seq_len) batches of `blocks` in order, topped up with
    all-`<pad>` rows (the model gives them zero weight) when the blocks run out."""
    rows = num_batches * batch_size
    padded = np.full((rows, blocks.shape[1]), PAD_ID, np.int32)
    n = min(rows, len(blocks))
    padded[:n] = blocks[:n]
    return [padded[i * batch_size : (i + 1) * batch_size] for i in range(num_batches)]
