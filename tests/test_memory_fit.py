"""A config too big for its devices is refused before step 0 in one line, from the compiled
programs' own memory, never faked: the device's memory is lowered through the documented
override (`MAELM_JAX_DEVICE_MEMORY_BYTES`) until the real need exceeds it."""

import jax
import jax.monitoring
import numpy as np
import pytest
from process_runs import describe, run_main
from text_corpora import sample_document, write_corpus
from tiny_configs import VOCAB, run_flags, tiny_run_config

from maelm_jax.checkpoints import manifest
from maelm_jax.config import configdict
from maelm_jax.config.run_config import ConfigError
from maelm_jax.data import tokenizer as tokenizer_lib
from maelm_jax.step import programs, sharding
from maelm_jax.training import memory_fit
from maelm_jax.training.memory_fit import ENV_VAR, DeviceMemory

KEYS = ("batch_size", "eval_batches=0", "grad_accum_steps", "model.remat_policy")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"), [sample_document(i) for i in range(160)])


@pytest.fixture(scope="module")
def config(corpus):
    """A tiny model with a batch large enough that the eval logits outweigh the state."""
    return tiny_run_config(corpus, batch_size=64, eval_batches=3, num_train_steps=4)


@pytest.fixture(scope="module")
def measured(config):
    """(the programs, {program: per-device bytes}) compiled for the session's 8 CPU devices,
    the mesh the runs below build."""
    run = configdict.freeze(config)
    progs = programs.build(run, sharding.create_mesh(run.mesh), VOCAB)
    need = memory_fit.needs(run, progs)
    assert set(need) == {"train", "eval"} and all(n and n > 0 for n in need.values()), need
    return progs, need


@pytest.fixture(scope="module")
def need(measured):
    return measured[1]


def test_the_first_eval_and_step_run_the_programs_the_check_compiled(config, measured):
    """The check costs a small run no time: the loop's first eval and train step neither
    trace, lower nor compile again (without the check's compiles, each does all three)."""
    progs, _ = measured
    state = progs.initialize(jax.random.PRNGKey(0))
    rows = np.full((config.batch_size, config.seq_len), 5, np.int32)
    events = []

    def listen(name, seconds, **kwargs):
        events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        with sharding.activate(progs.mesh, progs.rules):
            batch = progs.global_batch(rows)
            jax.device_get(progs.eval_step(state.params, batch, np.int32(0)))
            jax.device_get(progs.train_step(state, batch)[1])
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert [e for e in events if e.startswith("/jax/core/compile/")] == []


def line_of(result) -> str:
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def test_a_config_over_the_device_memory_stops_before_step_0_in_one_line(config, need, tmp_path):
    """The run names what each program needs per device and what a device has, says which
    keys to change, exits 1 without a traceback, and leaves no checkpoint or metric behind.
    (Before the check, the run ignored the limit and trained: exit 0.)"""
    limit = min(need.values()) // 2
    workdir = tmp_path / "run"
    (result,) = run_main(
        [f"--workdir={workdir}", *run_flags(config)],
        num_processes=1,
        devices=8,
        log_dir=tmp_path / "logs",
        timeout=300,
        extra_env={0: {ENV_VAR: str(limit)}},
    )
    assert result.returncode == 1, describe([result])
    assert "Traceback" not in result.stderr, describe([result])
    line = line_of(result)
    assert line.startswith("maelm_jax: error: the programs do not fit in device memory"), line
    # the tokenizer the run trained has the vocabulary the needs above were compiled with
    vocab = tokenizer_lib.Tokenizer.from_path(workdir / tokenizer_lib.MODEL_FILENAME).vocab_size
    assert vocab == VOCAB
    assert f"the train step {memory_fit.human_bytes(need['train'])}" in line, line
    assert f"the eval step {memory_fit.human_bytes(need['eval'])}" in line, line
    assert f"a device has {memory_fit.human_bytes(limit)} ({ENV_VAR}={limit})" in line, line
    assert all(key in line for key in KEYS), line
    assert "for steps 0..4" not in result.stderr  # stopped before the loop's first line
    assert not (workdir / manifest.CHECKPOINT_DIRNAME).exists()
    assert not (workdir / "metrics.jsonl").exists()


def test_only_the_process_whose_device_is_short_says_so_and_every_process_exits(
    config, need, tmp_path
):
    """Each process checks its own devices; the others fail with it, naming it."""
    (workdir := tmp_path / "run").mkdir()
    results = run_main(
        [f"--workdir={workdir}", *run_flags(config)],
        num_processes=2,
        log_dir=tmp_path / "logs",
        timeout=300,
        extra_env={1: {ENV_VAR: str(min(need.values()) // 2)}},
    )
    assert [r.returncode for r in results] == [1, 1], describe(results)
    assert all("Traceback" not in r.stderr for r in results), describe(results)
    first, second = map(line_of, results)
    assert "process(es) [1] failed while checking that the programs fit" in first, first
    assert "the programs do not fit in device memory" in second, second
    assert not (workdir / manifest.CHECKPOINT_DIRNAME).exists()


def test_near_the_limit_warns_and_well_under_it_says_nothing(config, need):
    run = configdict.freeze(config)
    top = max(need.values())
    error, warning = memory_fit.verdict(run, need, DeviceMemory(int(top / 0.95), "t"), "cpu")
    assert error is None
    assert warning.startswith("The programs fill over 90% of device memory"), warning
    assert memory_fit.human_bytes(need["eval"]) in warning and "batch_size" in warning
    error, warning = memory_fit.verdict(run, need, DeviceMemory(top - 1, "t"), "tpu")
    assert isinstance(error, ConfigError) and warning is None
    assert "maelm_jax.compile --topology=... --max_batch" in str(error)  # a TPU's way to size it
    assert memory_fit.verdict(run, need, DeviceMemory(2 * top, "t"), "cpu") == (None, None)


def test_the_host_memory_of_this_machine_holds_the_tiny_programs(config, need):
    """Without the override, CPU devices share the host's available memory; the tiny
    programs fit with room to spare (the default config's run passes the same check:
    test_train.py::test_cli_trains_the_default_config)."""
    devices = sharding.create_mesh(configdict.freeze(config).mesh).local_devices
    memory = memory_fit.device_memory(devices, environ={})
    assert memory.source == "the host's available memory, shared by 8 CPU devices"
    assert memory.bytes * 8 == pytest.approx(memory_fit.host_available_bytes(), rel=0.2)
    run = configdict.freeze(config)
    assert memory_fit.verdict(run, need, memory, "cpu") == (None, None)
    assert memory_fit.device_memory(devices, environ={ENV_VAR: "off"}) is None


@pytest.mark.parametrize(
    "text,size", [("1024", 1024), ("20GiB", 20 * 2**30), ("512 MiB", 2**29), ("1.5G", 3 * 2**29)]
)
def test_the_override_takes_bytes_or_a_binary_unit(text, size):
    assert memory_fit.parse_size(text) == size


def test_an_override_that_is_no_size_is_one_line_naming_it():
    with pytest.raises(ConfigError, match=rf"{ENV_VAR}='20 gigs' is no size: give bytes"):
        memory_fit.device_memory([None], environ={ENV_VAR: "20 gigs"})


def test_a_cgroup_limit_below_the_host_memory_is_what_counts(tmp_path):
    """cgroup v2 (`memory.max`) and v1 (`memory.limit_in_bytes`); v1's 'no limit' is a
    number near 2**63 and v2's is 'max'."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    8388608 kB\n")
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    v2.mkdir()
    (v2 / "memory.max").write_text(f"{4 * 2**30}\n")
    (v2 / "memory.current").write_text(f"{2**30}\n")
    assert memory_fit.host_available_bytes(str(meminfo), str(v2)) == 3 * 2**30
    (v2 / "memory.max").write_text("max\n")
    assert memory_fit.host_available_bytes(str(meminfo), str(v2)) == 8 * 2**30
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text(f"{2**30}\n")
    assert memory_fit.host_available_bytes(str(meminfo), str(v1)) == 8 * 2**30
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{2 * 2**30}\n")
    assert memory_fit.host_available_bytes(str(meminfo), str(v1)) == 2**30
