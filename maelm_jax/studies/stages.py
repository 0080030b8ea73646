"""A study's stages, each done once: the corpus (when the configs name the study's own),
pretraining of every objective, then export -> finetune -> rank per objective, and finetune
alone for the random-init row. On several processes (a pod) every process pretrains and
process 0 alone does the rest (`hosts`).

A finished stage leaves `<row>/<stage>.json` (its measurements, written whole or not at all),
and is not redone unless a later stage needs what it made and that is gone (a study folder
copied without its checkpoints and exports: `resume`). A stage killed midway is redone from
where its own work allows: pretraining resumes from its newest checkpoint, the search reuses
its finished runs, the export appears only once parity holds.
"""

import json
import os
import statistics
import time

import jax
from absl import logging

from maelm_jax.config import configdict
from maelm_jax.config.run_config import STUDY_TASK_TEXT, ConfigError
from maelm_jax.finetuning.search import run_search, write_json
from maelm_jax.hardware import handover, multihost
from maelm_jax.studies import hosts, resume, task_text
from maelm_jax.studies.plan import RANDOM_ROW, Study, marker


def once(study_dir: str, row: str, stage: str, work, together: bool = False) -> dict | None:
    """`work()`'s result, computed the first time and read back from the marker after.

    `together`: a stage every process runs (collective). All agree on whether it is done,
    `work()` returns the result on process 0 alone, which writes the marker, and nobody goes
    on before it is written, nor alone when one process failed; None on the others."""
    path = marker(study_dir, row, stage)
    done = os.path.isfile(path)
    if multihost.all_true(done) if together else done:
        with open(path) as f:
            logging.info("study: %s/%s already done", row, stage)
            return json.load(f)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    logging.info("study: %s/%s starting", row, stage)
    start = time.perf_counter()
    result, error = None, None
    try:
        result = work()
        if result is not None:
            result = {**result, "seconds": time.perf_counter() - start}
            write_json(path, result)
            logging.info("study: %s/%s done in %.0f s", row, stage, result["seconds"])
    except Exception as e:
        if not together:
            raise
        error = e
    if together:  # a barrier: the marker exists before anyone reads it
        multihost.raise_together(error, f"the study's {row}/{stage}")
    return result


def pretrain(config, workdir: str, name: str) -> dict | None:
    """The ordinary `main` path (train_and_evaluate), then what the table reports of it:
    on process 0, the one that writes the metrics (None on the others). A preemption that
    stopped it short raises `Preempted` on every process alike (the stop step is agreed), so
    no marker is written and no later stage starts; the rerun resumes from the saved step."""
    from maelm_jax.model import flop_count
    from maelm_jax.training import metric_logging, preemption, train

    run = configdict.freeze(config)
    steps = train.train_and_evaluate(run, workdir)
    if steps < run.loop.num_train_steps:
        raise preemption.Preempted(
            f"preempted during {name}'s pretraining: saved step {steps} of "
            f"{run.loop.num_train_steps} in {workdir}; rerun the same command to continue"
        )
    if jax.process_index() != 0:
        return None
    lines = [row for _, row in sorted(metric_logging.read_metrics(workdir).items())]
    evals = [m["eval/loss"] for m in lines if "eval/loss" in m]
    rates = [m["tokens_per_sec"] for m in lines if "tokens_per_sec" in m]
    params = flop_count.num_params(run)
    return {
        "processes": jax.process_count(),  # the data order's (check_one_data_order)
        "objective": run.objective,
        "decoder": run.model.decoder if run.objective != "mlm" else "none",
        "num_decoder_layers": run.model.num_decoder_layers if run.objective != "mlm" else 0,
        "mask_rate": run.masking.mask_rate,
        "pretraining_params": params,
        "steps": steps,  # what the checkpoint holds, read back from it
        "flops": flop_count.step_flops(run, params) * steps,
        "tokens": steps * run.batch_size * run.seq_len,
        "tokens_per_sec": statistics.median(rates[1:] or rates) if rates else None,
        "final_eval_loss": evals[-1] if evals else None,
    }


def export(workdir: str, out: str, step: int, fresh_runtime: bool) -> dict:
    """The pretraining's last step, named: never an older checkpoint that happens to be the
    newest usable one (the last moved aside as damaged)."""
    if not os.path.isfile(os.path.join(out, "config.json")):  # else: done, marker lost
        if fresh_runtime:
            args = (f"--workdir={workdir}", f"--output_dir={out}", f"--step={step}")
            hosts.run_command("export", *args)
        else:
            from maelm_jax.hf.export import export as export_checkpoint

            export_checkpoint(workdir, out, step)
    from safetensors import safe_open

    with safe_open(os.path.join(out, "model.safetensors"), "np") as f:
        # the encoder only: an MLM export also carries its LM head, which fine-tuning drops
        params = sum(_numel(f, k) for k in f.keys() if not k.startswith("lm_head."))  # noqa: SIM118
    with open(os.path.join(out, "config.json")) as f:
        hf_class = json.load(f)["architectures"][0]
    return {"encoder_params": params, "hf_class": hf_class}


def _numel(f, key: str) -> int:
    n = 1
    for d in f.get_slice(key).get_shape():
        n *= d
    return n


def finetune(study: Study, row: str, export_dir: str, out: str, init: str) -> dict:
    resume.check_search(row, export_dir, out)
    result = run_search(
        export_dir, list(study.tasks), study.recipe, out, inits=(init,), glue_dir=study.glue_dir
    )
    return {  # the GLUE average of GLUE's tasks alone (None without one): SQuAD is not in it
        "glue_average": result["glue_score"].get(init),
        "tasks": {t["task"]: t for t in result["tasks"]},
    }


def rank(
    workdir: str, out: str, step: int, dataset: str, num_tokens: int, fresh_runtime: bool
) -> dict:
    """The eval split of `dataset` as the study names it now, not as the checkpoint stored
    it: a study folder moved with its checkpoints has its corpus at the new path."""
    if fresh_runtime:
        args = (f"--workdir={workdir}", f"--output_dir={out}", f"--step={step}")
        hosts.run_command("analysis", *args, f"--dataset={dataset}", f"--num_tokens={num_tokens}")
        with open(os.path.join(out, "rank.json")) as f:
            result = json.load(f)
    else:
        from maelm_jax.inspection import representation_rank

        result = representation_rank.run(workdir, out, step, num_tokens, None, dataset)
    no_mask = result["conditions"]["no_mask"]
    return {
        "last_layer_entropy_rank": no_mask["entropy"][-1],
        "last_layer_pca90": no_mask["pca90"][-1],
    }


def with_corpus(study: Study, study_dir: str) -> dict:
    """The configs as pretraining reads them: where they name the study's own corpus (they
    all do or none, plan.SHARED_KEYS), it is written once and each config points at it."""
    if next(iter(study.configs.values())).dataset != STUDY_TASK_TEXT:
        return study.configs
    hosts.on_process_0(
        "writing the study's corpus",
        lambda: once(
            study_dir,
            task_text.CORPUS_DIR,
            "task_text",
            lambda: task_text.write(study.tasks, study.glue_dir, study_dir),
        ),
    )
    configs = {}
    for name, config in study.configs.items():
        configs[name] = config.copy_and_resolve_references()
        configs[name].dataset = task_text.dataset(study_dir)
    return configs


def hand_over_the_accelerator() -> None:
    """Once pretraining is done JAX's part of the accelerator is PyTorch's (fine-tuning),
    and what JAX computes after it (the export's parity, the rank) runs on the CPU as the
    `export` and `analysis` commands do (hardware/handover.py). A JAX that cannot let go
    leaves fine-tuning less memory, not a wrong result: a warning, not a failure."""
    try:
        handover.to_cpu()
    except RuntimeError as e:
        logging.warning("study: %s; fine-tuning gets what JAX left of the accelerator", e)
        return
    free = accelerator_memory()
    if free:
        logging.info("study: fine-tuning has %.1f of %.1f GiB of the GPU free", *free)


def accelerator_memory() -> tuple[float, float] | None:
    """(free, total) GiB of PyTorch's CUDA device, None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return free / 2**30, total / 2**30


def check_one_data_order(study_dir: str, names) -> None:
    """Refuses to pretrain the rest of a study on another number of processes than the
    objectives already pretrained: each process reads its own shards of the corpus, so the
    count is part of the data order the objectives must share. Once all are pretrained the
    count no longer matters (export, fine-tuning and rank read files)."""
    done, todo = {}, []
    for name in names:
        path = marker(study_dir, name, "pretrain")
        if os.path.isfile(path):
            with open(path) as f:  # a marker from before the count was kept: one process
                done[name] = json.load(f).get("processes", 1)
        else:
            todo.append(name)
    now = jax.process_count()
    other = {name: n for name, n in done.items() if n != now}
    if todo and other:
        name, n = next(iter(other.items()))
        raise ConfigError(
            f"--study_dir={study_dir}: {name} was pretrained on {n} process(es) and this run "
            f"has {now}; {', '.join(todo)} must see the same data order: rerun on {n} "
            "process(es), or start a new --study_dir"
        )


def run_all(study: Study, study_dir: str) -> dict | None:
    """Every objective pretrained, then each one's export, fine-tuning and rank, the
    random-init row last. None on a process other than 0 of a multi-process study: it leaves
    once pretraining is done."""
    hosts.on_process_0(
        "looking for what the study folder lacks", lambda: resume.reopen(study, study_dir)
    )
    hosts.on_process_0(
        "checking the study's process count",
        lambda: check_one_data_order(study_dir, study.configs),
    )
    configs = with_corpus(study, study_dir)
    pretrained = {
        name: once(
            study_dir,
            name,
            "pretrain",
            lambda c=config, n=name: pretrain(c, study.workdir(study_dir, n), n),
            together=True,
        )
        for name, config in configs.items()
    }
    # Process 0 alone after this. In a pod's JAX runtime (its process count the pod's) the
    # export and rank run as commands; a job of one process (`--num_processes=1`) leaves
    # its job too, then hands its accelerator over as any lone process does.
    fresh_runtime = hosts.many()
    if hosts.joined() and not hosts.leave_job():
        return None
    hand_over_the_accelerator()
    rows = {}
    for name in configs:
        base = os.path.join(study_dir, name)
        workdir, export_dir = study.workdir(study_dir, name), study.export_dir(study_dir, name)
        steps = configs[name].num_train_steps
        rows[name] = {
            "pretrain": pretrained[name],
            "export": once(
                study_dir,
                name,
                "export",
                lambda w=workdir, e=export_dir, s=steps: export(w, e, s, fresh_runtime),
            ),
            "finetune": once(
                study_dir,
                name,
                "finetune",
                lambda n=name, e=export_dir, b=base: finetune(
                    study, n, e, os.path.join(b, "finetune"), "pretrained"
                ),
            ),
            "rank": once(
                study_dir,
                name,
                "rank",
                lambda w=workdir, b=base, s=steps, d=configs[name].dataset: rank(
                    w, os.path.join(b, "rank"), s, d, study.rank_tokens, fresh_runtime
                ),
            ),
        }
    first = next(iter(study.configs))
    first_export = study.export_dir(study_dir, first)
    rows[RANDOM_ROW] = {
        "architecture_of": first,
        "finetune": once(
            study_dir,
            RANDOM_ROW,
            "finetune",
            lambda: finetune(
                study,
                RANDOM_ROW,
                first_export,
                os.path.join(study_dir, RANDOM_ROW, "finetune"),
                "random",
            ),
        ),
    }
    return rows
