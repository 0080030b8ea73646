"""Test-session setup: 8 simulated CPU devices, set before anything imports jax."""

import os
import pathlib
import shutil
import sys
import tempfile

from xla_flags import FAST_COMPILE  # tests/ is on sys.path (pytest puts it there)

# Compile-time flags for tiny programs (xla_flags.py); tests/process_runs.py sets the same.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8 " + FAST_COMPILE
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the session: the xdist workers and every process the
# tests start inherit it, so a tiny program compiled once (the same train step in a baseline
# run, its killed twin and its rerun) is read back, not compiled again. Made by the first
# process to import this file (the xdist controller) and removed by it at the end.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="maelm_jax_xla_cache_")
    os.environ["MAELM_JAX_TEST_CACHE_OWNER"] = str(os.getpid())
# Runs prepare their corpus next to the TFDS data (`data_dir`, else TFDS_DATA_DIR): one
# folder for the session, so no test writes under the home directory's ~/tensorflow_datasets.
if "MAELM_JAX_TEST_TFDS_OWNER" not in os.environ:
    os.environ["TFDS_DATA_DIR"] = tempfile.mkdtemp(prefix="maelm_jax_tfds_")
    os.environ["MAELM_JAX_TEST_TFDS_OWNER"] = str(os.getpid())
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


import pytest  # noqa: E402

# The modules that take a minute or more, heaviest first (worker seconds in a whole-suite run
# on the 2-core machine, 2026-11-28, other jobs running: test_model 398 ... test_study_resume
# 57). pytest.ini has xdist hand modules out in collection order, and this is it: longest
# first, so the two workers finish together on the short modules rather than one running a
# long module alone at the end. Only the time depends on this list: a module missing from it
# runs after these, in file order.
HEAVIEST_FIRST = (
    "test_model.py",
    "test_checkpointing.py",
    "test_finetune.py",
    "test_compile.py",
    "test_study.py",
    "test_multiprocess.py",
    "test_flops.py",
    "test_modern.py",
    "test_train.py",
    "test_aot_step_time.py",
    "test_bench.py",
    "test_bad_input.py",
    "test_sharding.py",
    "test_study_resume.py",
)

# The slow set: what the README's test command leaves out (pytest.ini's `-m "not slow"`) and
# `.ci/run` runs after it (`python -m pytest -q -m slow tests`), so no check leaves CI. Chosen
# by measured cost (the same run; docs/results.md, "The test suite"): the TPU compile-only
# tests, the multi-process and end-to-end runs (study, the README command, kill -9), every
# module that trains tiny checkpoints to export and fine-tune, and the heaviest equivalence
# checks, about 1,640 of the 2,700 worker seconds. Whole modules, then single tests.
SLOW_MODULES = {
    "test_compile.py",  # TPU compile-only: the preflight, max batch
    "test_flops.py",  # TPU compile-only FLOPs and the step-time split
    "test_aot_step_time.py",  # TPU compile-only step-time extrapolation
    "test_multiprocess.py",  # jax.distributed runs on localhost
    "test_study.py",  # `study` end to end, on one and on two processes
    "test_study_resume.py",
    "test_study_faults.py",  # `study` under one-process clusters and SIGTERM (about 6 min)
    "test_bench.py",
    "test_finetune.py",  # trains the shared tiny checkpoints (about 130 s)
    "test_squad_finetune.py",  # trains its own tiny checkpoint, then SQuAD runs (about 4 min)
    "test_export.py",
    "test_analysis.py",
    "test_modern_export.py",
    "test_stsb_regression.py",
    "test_prepared_corpus.py",
    "test_demo_recipe.py",
    "test_sharding.py",  # every mesh against one device
    "test_sharding_cross_decoder.py",
}
SLOW_TESTS = {
    "test_train.py::test_cli_trains_the_default_config",  # the README's first command
    "test_checkpointing.py::test_kill_9_then_rerun_matches_an_uninterrupted_run_bit_for_bit",
    "test_launch.py::test_preflight_refuses_a_config_that_does_not_fit",  # a TPU compile
    "test_memory_fit.py::test_only_the_process_whose_device_is_short_says_so_and_every_process_exits",
    "test_accelerator_paths.py::test_a_checkpoint_trained_with_a_platform_kernel_exports_and_is_analysed",
    "test_accelerator_paths.py::test_the_parity_and_the_rank_compute_every_matmul_in_full_float32",
    "test_model.py::test_remat_gives_the_same_gradients",
    "test_model.py::test_lm_head_in_blocks_gives_the_same_sums_and_gradients",
    "test_model.py::test_scan_over_layers_gives_the_same_loss_and_gradients",
    # The CLI runs that kept the fast set inside 10 minutes once #68's and #69's tests came
    # (it measured 10 min 37 s with them, 2026-11-29): signals, NaN policies, retention.
    "test_checkpointing.py::test_sigterm_saves_where_it_stopped_and_the_rerun_goes_on_from_there",
    "test_checkpointing.py::test_a_recovered_corrupt_checkpoint_says_so_in_one_line_without_a_traceback",
    "test_checkpointing.py::test_nan_with_stop_exits_non_zero_naming_the_step_and_keeps_the_last_good_checkpoint",
    "test_checkpointing.py::test_nan_with_skip_trains_to_the_end",
    "test_checkpointing.py::test_keeps_the_last_checkpoints_and_every_milestone",
    "test_interrupt.py::test_ctrl_c_saves_where_it_stopped_and_exits_130_with_one_line",
    "test_platform_defaults.py::test_an_rbg_run_repeats_itself_and_differs_from_threefry",
    "test_memory_fit.py::test_a_config_over_the_device_memory_stops_before_step_0_in_one_line",
    "test_preset_check.py::test_the_gpu_preset_is_refused_where_jax_runs_on_the_cpu_unless_asked",
}


def is_slow(item) -> bool:
    name = item.path.name
    return name in SLOW_MODULES or f"{name}::{item.originalname}" in SLOW_TESTS


@pytest.hookimpl(tryfirst=True)  # marked before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    del config
    for item in items:
        if is_slow(item):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order after


def pytest_unconfigure(config):
    del config
    if os.environ.get("MAELM_JAX_TEST_CACHE_OWNER") == str(os.getpid()):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
    if os.environ.get("MAELM_JAX_TEST_TFDS_OWNER") == str(os.getpid()):
        shutil.rmtree(os.environ["TFDS_DATA_DIR"], ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """{kind: workdir} of three tiny runs trained once per session, checkpointed at the end:
    MLM (scanned layers), MAE-LM with the relative position bias (unrolled layers) and
    3ML-cross (scanned). Shared by the export, analysis and fine-tuning tests, which only
    read them: under xdist the first worker to ask trains them in the session's shared
    temporary folder (a file lock held meanwhile) and the other worker reads the same runs
    instead of training its own."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:  # no xdist: this process is the session
        return _train_tiny_checkpoints(tmp_path_factory.mktemp("tiny_checkpoints"))
    from filelock import FileLock

    # The parent of a worker's base temp is this session's, shared by its workers alone.
    root = tmp_path_factory.getbasetemp().parent / "tiny_checkpoints"
    with FileLock(f"{root}.lock"):
        done = root / "done"
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)  # a worker that failed midway
            root.mkdir()
            workdirs = _train_tiny_checkpoints(root)
            done.write_text(",".join(workdirs))
        return {kind: root / kind for kind in done.read_text().split(",")}


def _train_tiny_checkpoints(root):
    from text_corpora import sample_document, write_corpus
    from tiny_configs import tiny_run_config

    from maelm_jax.config import configdict
    from maelm_jax.training import train

    dataset = write_corpus(root / "corpus", [sample_document(i) for i in range(240)])
    kinds = {
        "mlm": {"objective": "mlm"},
        "mae_lm": {
            "model.relative_attention_buckets": 16,
            "model.relative_attention_max_distance": 16,
            "model.scan_layers": False,
        },
        "3ml_cross": {"model.decoder": "cross"},
    }
    workdirs = {}
    for kind, overrides in kinds.items():
        config = tiny_run_config(
            dataset,
            num_train_steps=3,
            warmup_steps=1,
            checkpoint_every_steps=3,
            eval_batches=0,
            **overrides,
        )
        workdirs[kind] = root / kind
        train.train_and_evaluate(configdict.freeze(config), workdirs[kind])
    return workdirs
