"""What differs on an accelerator, checked on this CPU (docs/accelerators.md): cluster
detection on a machine that ships mpi4py, the precision of the export's parity and of the
rank, the kernels a shipped config reaches on each platform, a checkpoint trained with a
platform's kernel read back anywhere, and the host facts a GPU pod differs in (TPU
detection, usable CPUs, the MFU table's peaks)."""

import dataclasses
import glob
import os
import pathlib
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_configs import REPO_ROOT, tiny_config, tiny_run_config

from maelm_jax.config import cli, configdict
from maelm_jax.config.run_config import ConfigError
from maelm_jax.hardware import accelerators, distributed, host_cpus, platforms
from maelm_jax.hf import export as hf_export
from maelm_jax.inspection import representation_rank, trained_model
from maelm_jax.model.masked_lm import init_inputs
from maelm_jax.step import programs

CLUSTER_VARS = (
    "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID",
    "OMPI_MCA_orte_hnp_uri", "KUBERNETES_SERVICE_HOST", "JOB_COMPLETION_INDEX",
    distributed.CLUSTER_ENV_VAR,
)  # fmt: skip


@pytest.fixture
def lone_host(monkeypatch):
    """No cluster's variables, and an importable mpi4py, as in NVIDIA's containers."""
    for name in CLUSTER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(str(REPO_ROOT / "tests" / "mpi4py_importable"))
    return monkeypatch


def test_an_importable_mpi4py_is_no_cluster_unless_opted_into(lone_host):
    assert distributed.detected_cluster("auto") is None
    assert distributed.detected_cluster("mpi4py") == "mpi4py"  # `mpirun ... --cluster_...`
    assert distributed.detected_cluster("none") is None
    with pytest.raises(ConfigError, match=r"'nccl'.*'auto', 'none'.*'mpi4py'"):
        distributed.detected_cluster("nccl")


def test_a_lone_kubernetes_pod_is_no_cluster_and_the_api_server_is_not_asked(lone_host):
    lone_host.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert distributed.detected_cluster("auto") is None
    assert not [w for w in caught if "Kubernetes" in str(w.message)]


def test_a_slurm_job_is_a_cluster(lone_host):
    for name, value in zip(CLUSTER_VARS[:5], ("7", "node[1-2]", "2", "0", "0"), strict=True):
        lone_host.setenv(name, value)
    assert distributed.detected_cluster("auto") == "slurm"


def _dots(lowered) -> list[str]:
    return re.findall(r"stablehlo\.dot_general.*", lowered.as_text())


def test_the_parity_and_the_rank_compute_every_matmul_in_full_float32(tiny_checkpoints):
    """JAX's default is TF32 on a GPU and one bf16 pass on a TPU: the parity against
    PyTorch's float32 (1e-4) failed at 0.0044 on an H200."""
    trained = trained_model.load(tiny_checkpoints["mlm"])
    ids = hf_export.parity_batch(trained)
    positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
    parity = hf_export.parity_fn(trained, with_lm_head=True)
    model, params = representation_rank.unrolled(trained)
    rank = representation_rank.layer_outputs_fn(model, trained.model_config.num_layers)
    for dots in (
        _dots(parity.lower(trained.params, ids, positions)),
        _dots(rank.lower(params, ids)),
    ):
        assert dots and all("precision = [HIGHEST, HIGHEST]" in d for d in dots), dots[:2]


# Every config a user can name (configs/modern.py is the modern configs' shared part).
SHIPPED = sorted(
    p for p in glob.glob(str(REPO_ROOT / "configs" / "**" / "*.py"), recursive=True)
    if "def get_config" in pathlib.Path(p).read_text() and os.path.basename(p) != "base.py"
)  # fmt: skip


@pytest.fixture
def cudnn_present(monkeypatch):
    """JAX's cuDNN attention as on an H200: its version and compute-capability probes (the
    only parts that need a GPU) answer as there, so tracing reaches its input checks."""
    from jax._src.cudnn import fused_attention_stablehlo as fas

    monkeypatch.setattr(fas, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(fas, "check_compute_capability", lambda capability: True)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: os.path.relpath(p, REPO_ROOT / "configs"))
def test_no_shipped_config_reaches_a_kernel_that_cannot_take_it(path, cudnn_present):
    """Each shipped config's training forward traced as on an NVIDIA GPU (two encoder
    layers, so it traces in a second), and its kernels made concrete for every platform."""
    run = configdict.override(
        configdict.freeze(cli.load_config_file(path)), {"model.num_layers": 2}
    )
    for platform in ("tpu", "rocm", "cpu"):
        cfg = run.model.for_platform(platform)
        assert cfg.attention_impl in ("xla", "splash") and cfg.relative_bias_impl == "dense"
    model, masking = programs.model_and_masking(run, run.data.vocab_size, "gpu")
    cfg = model.config
    if cfg.attention_impl == "cudnn":
        assert jnp.dtype(cfg.dtype) == jnp.bfloat16
    k = masking.num_masked
    batch = jax.ShapeDtypeStruct((2, run.seq_len), jnp.int32)
    masked = jax.ShapeDtypeStruct((2, k), jnp.int32)
    visible = jax.ShapeDtypeStruct((2, run.seq_len - k), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0), *init_inputs(run.seq_len, k))

    def forward(params, ids, masked_idx, visible_idx):
        return model.apply(
            params, ids, masked_idx, visible_idx, False, rngs={"dropout": jax.random.key(1)}
        )

    logits = jax.eval_shape(forward, params, batch, masked, visible)
    assert logits.shape[:2] == (2, k)


@pytest.mark.parametrize(
    "unroll,dropout,want",
    [(1, "auto", "xla"), (0, "auto", "cudnn"), (1, "cudnn", "another layer's dropout mask")],
)
def test_cudnn_dropout_only_where_every_layer_is_its_own_call(unroll, dropout, want):
    """cuDNN's dropout mask follows a per-call-site counter (model/kernels/cudnn.py): in a
    scanned loop, layer i's backward would draw another layer's mask."""
    model = dataclasses.replace(
        _tiny_model(),
        dtype=jnp.bfloat16,
        scan_layers=True,
        scan_unroll=unroll,
        attention_dropout_impl=dropout,
    )
    if want == "another layer's dropout mask":
        with pytest.raises(
            ConfigError, match=r"scan loop \(encoder \(2 layers, 1 a loop iteration\)\)"
        ):
            model.for_platform("gpu")
        return
    assert model.for_platform("gpu").attention_dropout_impl == want


def _tiny_model():
    return configdict.freeze(tiny_config()).model


def test_a_checkpoint_trained_with_a_platform_kernel_exports_and_is_analysed(tmp_path):
    """Trained with splash attention (here in the Pallas interpreter): export and analysis
    rebuild the same attention on XLA (`finetune --workdir` exports through the same path)."""
    from text_corpora import sample_document, write_corpus

    from maelm_jax.training import train

    dataset = write_corpus(tmp_path / "corpus", [sample_document(i) for i in range(120)])
    config = tiny_run_config(
        dataset,
        num_train_steps=2,
        warmup_steps=1,
        checkpoint_every_steps=2,
        eval_batches=0,
        **{"model.attention_impl": "splash", "model.attention_dropout_rate": 0.0},
    )
    workdir = tmp_path / "splash"
    train.train_and_evaluate(configdict.freeze(config), workdir)
    trained = trained_model.load(workdir)
    assert trained.config.model.attention_impl == "splash"  # as trained, kept in the record
    assert trained.model_config.attention_impl == "xla"
    result = hf_export.export(workdir, tmp_path / "export")
    assert result.max_abs_diff_hidden <= hf_export.TOLERANCE
    rank = representation_rank.run(workdir, tmp_path / "rank", None, 64, None)
    assert rank["conditions"]["no_mask"]["entropy"][-1] > 1


def test_a_gpu_vms_vfio_is_no_tpu_a_google_pci_device_is(tmp_path, monkeypatch):
    for name in platforms._TPU_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    for vendor, want in (("0x10de", False), ("0x1ae0", True)):  # NVIDIA's, Google's
        device = tmp_path / vendor / "0000:00:04.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text(f"{vendor}\n")
        assert platforms.google_pci_device_present(str(tmp_path / vendor)) is want
    if not glob.glob("/dev/accel*"):
        assert platforms.tpu_may_be_present(str(tmp_path / "0x10de")) is False


@pytest.mark.parametrize(
    "files,want",
    [
        ({"cpu.max": "150000 100000"}, 2),  # 1.5 CPUs of quota: 2 threads
        ({"cpu.max": "max 100000"}, None),
        ({"cpu/cpu.cfs_quota_us": "400000", "cpu/cpu.cfs_period_us": "100000"}, 4),  # v1
        ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
        ({}, None),
    ],
)
def test_the_cgroup_quota_bounds_the_cpus_a_pool_starts(tmp_path, files, want):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    assert host_cpus.cgroup_quota(str(tmp_path)) == want
    allowed = len(os.sched_getaffinity(0))
    assert host_cpus.usable_cpus(str(tmp_path)) == min(allowed, want or allowed)


@pytest.mark.parametrize(
    "kind,bf16",
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA H200 NVL", 835e12),
    ],
)
def test_pcie_and_nvl_cards_get_their_own_peak(kind, bf16):
    assert accelerators.peak_flops(kind, "bfloat16") == bf16
