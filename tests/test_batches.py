"""Train batches: a function of (seed, process, step), epochs, prefetching; errors in order."""

import numpy as np
import pytest

from maelm_jax.data.batches import Prefetcher, TrainBatches


def _numbered_blocks(n: int, seq_len: int = 4) -> np.ndarray:
    """Block i is filled with i, so a batch's first column names the blocks it holds."""
    return np.repeat(np.arange(n, dtype=np.int32)[:, None], seq_len, axis=1)


def test_batches_are_a_function_of_seed_process_and_step():
    blocks = _numbered_blocks(10)
    a = TrainBatches(blocks, 4, seed=1, process_index=0)
    b = TrainBatches(blocks, 4, seed=1, process_index=0)
    steps = range(12)
    assert all((a.batch(s) == b.batch(s)).all() for s in steps)
    other_seed = TrainBatches(blocks, 4, seed=2, process_index=0)
    other_process = TrainBatches(blocks, 4, seed=1, process_index=1)
    for other in (other_seed, other_process):
        assert any((a.batch(s) != other.batch(s)).any() for s in steps)
    assert a.batch(3).shape == (4, 4) and a.batch(3).dtype == np.int32


def test_a_step_does_not_depend_on_earlier_draws():
    blocks = _numbered_blocks(10)
    replayed = TrainBatches(blocks, 4, seed=3, process_index=0)
    for s in range(40):
        replayed.batch(s)
    for s in (41, 7, 26):  # forward, far back, middle: crosses the permutation cache
        fresh = TrainBatches(blocks, 4, seed=3, process_index=0)
        assert (fresh.batch(s) == replayed.batch(s)).all()


@pytest.mark.parametrize(("num_blocks", "batch_size"), [(10, 4), (3, 7)])
def test_each_epoch_visits_every_block_once(num_blocks, batch_size):
    batches = TrainBatches(_numbered_blocks(num_blocks), batch_size, 0, 0)
    epochs = 5
    steps = -(-epochs * num_blocks // batch_size)
    stream = np.concatenate([batches.batch(s)[:, 0] for s in range(steps)])
    orders = [stream[e * num_blocks : (e + 1) * num_blocks] for e in range(epochs)]
    assert all(sorted(o.tolist()) == list(range(num_blocks)) for o in orders)
    assert len({tuple(o.tolist()) for o in orders}) > 1  # reshuffled between epochs
    state = batches.state(7)
    epoch, position = divmod(7 * batch_size, num_blocks)
    assert (state["step"], state["epoch"], state["position_in_epoch"]) == (7, epoch, position)
    assert state["blocks"] == num_blocks


def test_prefetching_iterator_yields_the_steps_from_start():
    batches = TrainBatches(_numbered_blocks(10), 4, seed=5, process_index=0)
    with batches.iterate(start_step=6, prefetch=3) as it:
        got = [next(it) for _ in range(5)]
    assert all((g == batches.batch(6 + i)).all() for i, g in enumerate(got))
    assert not it._thread.is_alive()
    with pytest.raises(StopIteration):
        next(it)


def test_prefetcher_reraises_the_producers_error_in_order():
    def produce(step):
        if step == 3:
            raise RuntimeError("bad step 3")
        return step

    it = Prefetcher(produce, start=0, depth=2)
    assert [next(it), next(it), next(it)] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="bad step 3"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert not it._thread.is_alive()
