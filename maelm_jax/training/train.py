"""The training loop: `train_and_evaluate(run, workdir)`, everything behind `main`."""

import functools
import os

import jax
import numpy as np
from absl import logging

from maelm_jax.checkpoints import checkpointing
from maelm_jax.checkpoints.params import load_params
from maelm_jax.config import paths
from maelm_jax.config.run_config import ConfigError, RunConfig
from maelm_jax.data import batches, input_pipeline, unigram
from maelm_jax.hardware import handover, multihost
from maelm_jax.inspection import fill_in
from maelm_jax.step import programs, sharding
from maelm_jax.training import memory_fit, metric_logging, profile_window, telemetry
from maelm_jax.training.preemption import Interrupted, PreemptionWatcher


class NonFiniteLossError(RuntimeError):
    """The loss or gradient went NaN/inf and `run.loop.nonfinite == "stop"`."""


def _host_metrics(sums: dict[str, float], prefix: str) -> dict[str, float]:
    denominator = max(sums["weight_sum"], 1.0)
    return {
        f"{prefix}/loss": sums["loss_sum"] / denominator,
        f"{prefix}/accuracy": sums["correct_sum"] / denominator,
    }


def evaluate(progs: programs.Programs, params, eval_batches) -> dict[str, float]:
    """Masked-token loss and accuracy over the fixed eval batches."""
    totals = {"loss_sum": 0.0, "correct_sum": 0.0, "weight_sum": 0.0}
    for index, local_rows in enumerate(eval_batches):
        batch = progs.global_batch(local_rows)
        sums = jax.device_get(progs.eval_step(params, batch, np.int32(index)))
        for key in totals:
            totals[key] += float(sums[key])
    return _host_metrics(totals, "eval")


class _TrainMetrics:
    """Step metrics summed on the host between log lines.

    A step's metrics are read when the *next* step has been dispatched (`push`), so reading
    them never leaves the device idle; `settle` reads the last one before anything that must
    not run after an unchecked step (a log line, a checkpoint).
    """

    def __init__(self, nonfinite_policy: str, throughput: telemetry.Throughput):
        self._policy = nonfinite_policy
        self._throughput = throughput
        self._pending = None
        self.reset()

    def reset(self):
        self.sums = {"loss_sum": 0.0, "correct_sum": 0.0, "weight_sum": 0.0}
        self.steps = 0
        self.skipped = 0
        self.last = {}

    def push(self, step: int, metrics) -> None:
        """Records step `step` (0-based) and reads the one pushed before it."""
        self.settle()
        self._pending = (step, metrics)

    def settle(self) -> None:
        if self._pending is None:
            return
        step, metrics = self._pending
        self._pending = None
        m = jax.device_get(metrics)
        self._throughput.step_done()
        if int(m["nonfinite"]):
            if self._policy == "stop":
                raise NonFiniteLossError(
                    f"non-finite loss or gradient at step {step} (loss={float(m['loss'])}, "
                    f"grad_norm={float(m['grad_norm'])}); stopping without saving a checkpoint "
                    "after it. Set nonfinite='skip' to drop such updates and go on."
                )
            self.skipped += 1
            logging.warning("Step %d: non-finite loss/gradient, update skipped", step)
            return
        for key in self.sums:
            self.sums[key] += float(m[key])
        self.steps += 1
        self.last = {"grad_norm": float(m["grad_norm"]), "learning_rate": float(m["learning_rate"])}

    def row(self) -> dict[str, float]:
        """The log line since the last `reset`: per-target means, rates, skipped updates."""
        self.settle()
        # Only skipped steps since the last line: no loss to report, rather than a fake 0.
        row = _host_metrics(self.sums, "train") if self.steps else {}
        row |= self.last
        row |= self._throughput.row()  # tokens/s, model TFLOP/s, MFU, ETA
        row["skipped_updates"] = float(self.skipped)
        self.reset()
        return row


def _data_position(run: RunConfig, blocks_per_process: list[int], step: int) -> dict:
    """The input position of every process at `step` (each process has its own blocks)."""
    return {
        "process_count": len(blocks_per_process),
        "processes": [
            batches.stream_position(step, run.batch_size // len(blocks_per_process), n, run.seed, p)
            for p, n in enumerate(blocks_per_process)
        ],
    }


def _restore_or_initialize(run: RunConfig, progs, checkpointer, data_position, tokenizer):
    """Resume from this workdir's newest good checkpoint; else start at step 0, optionally
    from another run's weights (`init_from`). The two never mix: a workdir that has a
    checkpoint resumes, whatever init_from says."""
    abstract = progs.abstract_state()
    with sharding.activate(progs.mesh, progs.rules):
        restored = checkpointer.restore_latest(abstract)
    if restored is not None:
        state, saved_position = restored
        step = int(jax.device_get(state.step))
        if saved_position != data_position(step) and jax.process_index() == 0:
            logging.warning(
                "Resuming at step %d with a different input pipeline (saved %s, now %s): the "
                "batches will not match an uninterrupted run",
                step,
                saved_position,
                data_position(step),
            )
        return state
    state = progs.initialize(jax.random.PRNGKey(run.seed))
    if run.loop.init_from:
        params = load_params(run.loop.init_from, abstract.params, tokenizer.fingerprint)
        state = state.replace(params=params)
    return state


def train_and_evaluate(run: RunConfig, workdir: str | os.PathLike) -> int:
    """Trains `run` in `workdir` (created if needed); every process runs the same call.

    Rerunning with the same workdir resumes from the newest good checkpoint. Returns the
    step it stopped at: `run.loop.num_train_steps`, or fewer after a preemption (SIGTERM,
    saved). Raises `Interrupted` once Ctrl-C has saved a checkpoint and stopped it early.
    """
    # Random bits computed shard-locally, so masks and dropout never gather across devices
    # (the default in current JAX; pinned because the data path relies on it).
    jax.config.update("jax_threefry_partitionable", True)
    handover.check_not_handed_over(f"training in {workdir}")
    workdir = paths.path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    process_index, process_count = jax.process_index(), jax.process_count()

    # --- Mesh: layout errors surface before minutes of tokenization. ---
    mesh = sharding.create_mesh(run.mesh)
    sharding.check_batch(run, mesh, sharding.axis_rules(run.mesh))
    logging.info("Mesh %s over %d processes", dict(mesh.shape), process_count)

    # --- Input: the tokenizer and this process's shards (the corpus prepared once). ---
    tokenizer = input_pipeline.load_tokenizer(run.data, workdir)
    data, error = None, None
    try:
        data = input_pipeline.create_datasets(run.data, tokenizer, process_index, process_count)
    except ConfigError as e:  # maybe on this process only: its share may be empty
        error = e
    multihost.raise_together(error, "preparing their share of the data")
    data_position = functools.partial(
        _data_position, run, multihost.gather_ints(data.train.num_blocks)
    )

    # --- Programs and state: born sharded, or restored into the same shardings. ---
    progs = programs.build(run, mesh, tokenizer.vocab_size)
    memory_fit.check(run, progs)  # compiles both programs; too big for a device: one line
    checkpointer = checkpointing.Checkpointer(run, workdir, tokenizer)
    state = _restore_or_initialize(run, progs, checkpointer, data_position, tokenizer)
    start_step = int(jax.device_get(state.step))

    # --- Reporting: process 0 writes, everyone logs its own errors. ---
    loop = run.loop
    writer = metric_logging.create_writer(workdir)
    profile = profile_window.ProfileWindow(
        workdir,
        loop.profile_start_step,
        loop.profile_num_steps if process_index == 0 else 0,
        start_step,
    )
    logging.info(
        "Training %s%s for steps %d..%d: %d train blocks here, k=%d of %d tokens masked",
        run.objective,
        f" ({run.model.decoder} decoder)" if run.objective == "mae_lm" else "",
        start_step,
        loop.num_train_steps,
        data.train_blocks,
        progs.masking_cfg.num_masked,
        run.seq_len,
    )

    # --- The eval loss's context-free baseline (unigram.py), computed once. ---
    baseline = {}
    if loop.eval_batches:
        with sharding.activate(mesh, progs.rules):
            value = unigram.eval_unigram_loss(progs, data.eval)
        baseline = {"eval/unigram_loss": value}
        logging.info("Eval unigram baseline (no context): %.3f nats per token", value)

    # --- The loop. ---
    throughput = telemetry.Throughput.for_run(run, tokenizer.vocab_size, start_step)
    totals = _TrainMetrics(loop.nonfinite, throughput)
    preemption = PreemptionWatcher()
    train_batches = data.train.iterate(start_step)
    try:
        with sharding.activate(mesh, progs.rules), train_batches:
            if start_step == 0 and loop.eval_batches:  # the curve's origin
                writer.write_scalars(0, evaluate(progs, state.params, data.eval) | baseline)
            for step in range(start_step, loop.num_train_steps):
                with jax.profiler.StepTraceAnnotation("train", step_num=step):
                    state, metrics = progs.train_step(
                        state, progs.global_batch(next(train_batches))
                    )
                totals.push(step, metrics)
                done = step + 1
                profile(done)
                last = done == loop.num_train_steps
                preempted = preemption.reached(done)
                if done % loop.log_every_steps == 0 or last:
                    row = totals.row()
                    writer.write_scalars(done, row)
                    logging.info(telemetry.progress_line(done, loop.num_train_steps, row))
                if loop.eval_batches and (done % loop.eval_every_steps == 0 or last):
                    with throughput.timed("eval"):
                        row = evaluate(progs, state.params, data.eval) | baseline
                        writer.write_scalars(done, row)
                if last or preempted or done % run.checkpoint.every_steps == 0:
                    totals.settle()  # never checkpoint a step that has not been checked
                    with throughput.timed("checkpoint"):
                        checkpointer.save(done, state, data_position(done), force=True)
                checkpointer.check_for_errors()
                if preempted:
                    checkpointer.wait_until_finished()
                    logging.warning(
                        "Preempted (%s): saved a checkpoint at step %d and stopped; rerun the "
                        "same command to continue",
                        preemption.reason,
                        done,
                    )
                    break
            totals.settle()
            if int(jax.device_get(state.step)) == loop.num_train_steps:
                fill_in.print_fill_in(progs, state.params, data.eval, tokenizer, run.seed)
    finally:
        profile.close()
        preemption.close()
        writer.close()
        checkpointer.close()
    stopped = int(jax.device_get(state.step))
    logging.info("Stopped at step %d", stopped)
    if preemption.reason == "SIGINT" and stopped < loop.num_train_steps:
        raise Interrupted(
            f"interrupted (SIGINT): saved a checkpoint at step {stopped} and stopped; rerun "
            "the same command to continue"
        )
    return stopped
