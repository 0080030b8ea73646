"""The training loop: `train_and_evaluate(config, workdir)`, everything behind `main`."""

import os
import time

import jax
import ml_collections
import numpy as np
from absl import logging
from clu import periodic_actions
from etils import epath

from maelm_jax import (
    checkpointing,
    configuration,
    input_pipeline,
    metric_logging,
    programs,
    sharding,
)
from maelm_jax import documents as documents_lib
from maelm_jax import tokenizer as tokenizer_lib
from maelm_jax.preemption import PreemptionWatcher


class NonFiniteLossError(RuntimeError):
    """The loss or gradient went NaN/inf and `config.nonfinite == "stop"`."""


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
        batch = global_batch(progs, local_rows)
        sums = jax.device_get(progs.eval_step(params, batch, np.int32(index)))
        for key in totals:
            totals[key] += float(sums[key])
    return _host_metrics(totals, "eval")


def global_batch(progs: programs.Programs, local_rows: np.ndarray) -> dict:
    """This process's rows -> one global array sharded over the mesh's batch axes."""
    array = jax.make_array_from_process_local_data(progs.batch_sharding, local_rows)
    return {"input_ids": array}


class _TrainMetrics:
    """Sums step metrics on the host, one step behind the device so dispatch never waits."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.sums = {"loss_sum": 0.0, "correct_sum": 0.0, "weight_sum": 0.0}
        self.steps = 0
        self.skipped = 0
        self.start = time.perf_counter()
        self.last = {}

    def add(self, step: int, metrics, nonfinite_policy: str):
        """`step` is the step these metrics belong to (0-based)."""
        m = jax.device_get(metrics)
        if int(m["nonfinite"]):
            if nonfinite_policy == "stop":
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


def _restore_or_initialize(config, progs, checkpointer, data):
    """Resume from this workdir's newest good checkpoint; else start at step 0, optionally
    from another run's weights (`init_from`). The two never mix: a workdir that has a
    checkpoint resumes, whatever init_from says."""
    abstract = progs.abstract_state()
    with sharding.activate(progs.mesh, progs.rules):
        restored = checkpointer.restore_latest(abstract)
    if restored is not None:
        state, data_state = restored
        step = int(jax.device_get(state.step))
        expected = data.train.state(step)
        changed = {k: (data_state.get(k), v) for k, v in expected.items() if data_state.get(k) != v}
        changed.pop("process_index", None)
        if changed:
            logging.warning(
                "Resuming at step %d with a different input pipeline %s (saved, now): the "
                "batches will not match an uninterrupted run",
                step,
                changed,
            )
        return state
    state = progs.initialize(jax.random.PRNGKey(config.seed))
    if config.init_from:
        params = checkpointing.load_params(config.init_from, abstract.params)
        state = state.replace(params=params)
    return state


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> None:
    """Trains `config` in `workdir` (created if needed); every process runs the same call.

    Rerunning with the same workdir resumes from the newest good checkpoint.
    """
    jax.config.update("jax_threefry_partitionable", True)
    configuration.validate(config)
    workdir = epath.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    process_index, process_count = jax.process_index(), jax.process_count()

    # --- Mesh: layout errors surface before minutes of tokenization. ---
    mesh = sharding.create_mesh(config)
    sharding.check_batch(config, mesh, sharding.axis_rules(config))
    logging.info("Mesh %s over %d processes", dict(mesh.shape), process_count)

    # --- Input: the tokenizer (trained once per workdir) and this process's share. ---
    documents = documents_lib.documents_fn(config, process_index)
    tokenizer = tokenizer_lib.load_or_train(config, workdir, documents)
    data = input_pipeline.create_datasets(config, workdir, tokenizer, process_index, process_count)

    # --- Programs and state: born sharded, or restored into the same shardings. ---
    progs = programs.build(config, mesh, tokenizer.vocab_size)
    checkpointer = checkpointing.Checkpointer(config, workdir, tokenizer)
    state = _restore_or_initialize(config, progs, checkpointer, data)
    start_step = int(jax.device_get(state.step))

    # --- Reporting: process 0 writes, everyone logs its own errors. ---
    writer = metric_logging.create_writer(workdir)
    report = periodic_actions.ReportProgress(
        num_train_steps=config.num_train_steps,
        writer=writer,
        every_steps=config.log_every_steps,
        every_secs=None,
    )
    hooks = [report]
    if process_index == 0 and config.profile_num_steps > 0:
        hooks.append(
            periodic_actions.Profile(
                logdir=os.fspath(workdir), num_profile_steps=config.profile_num_steps
            )
        )
    tokens_per_step = config.batch_size * config.seq_len
    logging.info(
        "Training %s%s for steps %d..%d: %d train blocks here, k=%d of %d tokens masked",
        config.objective,
        f" ({config.model.decoder} decoder)" if config.objective == "mae_lm" else "",
        start_step,
        config.num_train_steps,
        data.train_blocks,
        progs.masking_cfg.num_masked,
        config.seq_len,
    )

    # --- The loop. Metrics are read one step late so the host never stalls dispatch. ---
    totals = _TrainMetrics()
    pending = None  # (step, metrics) of the last dispatched step
    preemption = PreemptionWatcher()
    batches = data.train.iterate(start_step)
    try:
        with sharding.activate(mesh, progs.rules), batches:
            for step in range(start_step, config.num_train_steps):
                with jax.profiler.StepTraceAnnotation("train", step_num=step):
                    state, metrics = progs.train_step(state, global_batch(progs, next(batches)))
                if pending is not None:
                    totals.add(*pending, config.nonfinite)
                pending = (step, metrics)
                done = step + 1
                for hook in hooks:
                    hook(done)
                last = done == config.num_train_steps
                preempted = preemption.reached(done)
                if done % config.log_every_steps == 0 or last:
                    totals.add(*pending, config.nonfinite)
                    pending = None
                    elapsed = time.perf_counter() - totals.start
                    row = _host_metrics(totals.sums, "train") | totals.last
                    row["tokens_per_sec"] = totals.steps * tokens_per_step / elapsed
                    row["skipped_updates"] = float(totals.skipped)
                    writer.write_scalars(done, row)
                    totals.reset()
                if config.eval_batches and (done % config.eval_every_steps == 0 or last):
                    with report.timed("eval"):
                        writer.write_scalars(done, evaluate(progs, state.params, data.eval))
                if last or preempted or done % config.checkpoint_every_steps == 0:
                    if pending is not None:  # never checkpoint a step not yet checked
                        totals.add(*pending, config.nonfinite)
                        pending = None
                    with report.timed("checkpoint"):
                        checkpointer.save(done, state, data.train.state(done), force=True)
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
            if pending is not None:
                totals.add(*pending, config.nonfinite)
    finally:
        preemption.close()
        writer.close()
        checkpointer.close()
    logging.info("Stopped at step %d", int(jax.device_get(state.step)))
