"""What differs on an accelerator, checked on this CPU (docs/accelerators.md): cluster
detection on a machine that ships mpi4py, the precision of the export's parity and of the
rank, the kernels a shipped config reaches on each platform, a checkpoint trained with a
platform's kernel read back anywhere, and the host facts a GPU pod differs in (TPU
detection, usable CPUs, the MFU table's peaks)."""

import dataclasses
import glob
import importlib.metadata
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


# PCI devices (vendor, device) as sysfs lists them on each machine.
A3_GPU_VM = (("0x10de", "0x2330"), ("0x1ae0", "0x0042"), ("0x1ae0", "0x001f"))  # H100, gVNIC, NVMe
V5E_TPU_VM = (("0x1ae0", "0x0063"), ("0x1ae0", "0x0063"), ("0x1ae0", "0x0042"))  # 2 chips, gVNIC


def _machine(root: pathlib.Path, pci: tuple, dev_files: tuple = ()) -> tuple[str, str]:
    """A sysfs PCI folder and a /dev of `root`'s own, as `platforms` reads them."""
    for i, (vendor, device) in enumerate(pci):
        folder = root / "pci" / f"0000:00:{i + 4:02x}.0"
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(f"{vendor}\n")
        (folder / "device").write_text(f"{device}\n")
    (root / "dev").mkdir()
    for name in dev_files:
        (root / "dev" / name).touch()
    return str(root / "pci"), str(root / "dev")


@pytest.fixture
def no_tpu_variables(monkeypatch):
    for name in platforms._TPU_ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def jax_picks_its_backend():
    """jax_platforms unset, as on a user's machine (the tests run with JAX_PLATFORMS=cpu);
    the backends this process already started are not touched."""
    chosen = jax.config.jax_platforms
    jax.config.update("jax_platforms", None)
    yield
    jax.config.update("jax_platforms", chosen)


def test_a_gpu_vms_google_nic_and_disk_are_no_tpu_a_tpu_chip_is(tmp_path, no_tpu_variables):
    gpu_vm = _machine(tmp_path / "a3", A3_GPU_VM, ("nvidia0", "nvidiactl"))
    assert not platforms.tpu_pci_device_present(gpu_vm[0])
    assert not platforms.tpu_may_be_present(*gpu_vm)
    assert platforms.tpu_may_be_present(*_machine(tmp_path / "v5e", V5E_TPU_VM))
    v4 = _machine(tmp_path / "v4", (("0x1ae0", "0x0042"),), ("accel0", "accel1"))
    assert platforms.tpu_may_be_present(*v4)  # /dev/accel*, not VFIO
    # every TPU the installed JAX knows by its PCI ID is one here too
    from jax._src import hardware_utils

    assert set(hardware_utils._TPU_PCI_DEVICE_IDS) <= platforms.tpu_pci_device_ids()


def test_a_gpu_preset_is_told_whether_jax_would_run_on_the_cpu_alone(
    tmp_path, no_tpu_variables, jax_picks_its_backend
):
    """Told from files and the config, before any backend starts."""
    bare = _machine(tmp_path / "bare", (("0x8086", "0x1237"), ("0x1ae0", "0x0042")))
    assert platforms.cpu_only(*bare) == "no GPU or TPU is visible"
    assert platforms.cpu_only(*_machine(tmp_path / "v5e", V5E_TPU_VM)) is None
    gpu_vm = _machine(tmp_path / "a3", A3_GPU_VM, ("nvidia0", "nvidiactl"))
    cuda_plugin = any(
        (d.metadata["Name"] or "").startswith("jax-cuda")
        for d in importlib.metadata.distributions()
    )  # the gpu extra's jax-cuda12-plugin: without it JAX runs on the CPU beside the GPU
    want = None if cuda_plugin else "an NVIDIA GPU, but no JAX CUDA plugin"
    assert platforms.cpu_only(*gpu_vm) == want
    jax.config.update("jax_platforms", "cpu")
    assert platforms.cpu_only(*_machine(tmp_path / "v5e_cpu", V5E_TPU_VM)) == "JAX_PLATFORMS=cpu"


V2_ROOT, V1_ROOT = "0::/\n", "2:cpu,cpuacct:/\n1:name=systemd:/\n0::/\n"
SLURM_STEP = "0::/system.slice/slurmstepd.scope/job_7/step_0\n"  # SLURM on cgroup v2


@pytest.mark.parametrize(
    "proc_cgroup,files,want",
    [
        (V2_ROOT, {"cpu.max": "150000 100000"}, 2),  # 1.5 CPUs of quota: 2 threads
        (V2_ROOT, {"cpu.max": "50000 100000"}, 1),  # half a CPU is still one thread
        (V2_ROOT, {"cpu.max": "max 100000"}, None),
        (V2_ROOT, {}, None),
        (V1_ROOT, {"cpu/cpu.cfs_quota_us": "400000", "cpu/cpu.cfs_period_us": "100000"}, 4),
        (V1_ROOT, {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
        # the job's cgroup sits below the mount: its parent's quota (2) binds, not its own (8)
        (
            SLURM_STEP,
            {
                "system.slice/slurmstepd.scope/job_7/cpu.max": "200000 100000",
                "system.slice/slurmstepd.scope/job_7/step_0/cpu.max": "800000 100000",
            },
            2,
        ),
        # only the leaf has a quota; every parent says "max"
        (
            SLURM_STEP,
            {
                "system.slice/cpu.max": "max 100000",
                "system.slice/slurmstepd.scope/job_7/cpu.max": "max 100000",
                "system.slice/slurmstepd.scope/job_7/step_0/cpu.max": "300000 100000",
            },
            3,
        ),
        # cgroup v1, a systemd slice's quota under the cpu controller's mount
        (
            "3:cpu,cpuacct:/user.slice/session-4.scope\n0::/user.slice/session-4.scope\n",
            {
                "cpu/user.slice/cpu.cfs_quota_us": "250000",
                "cpu/user.slice/cpu.cfs_period_us": "100000",
            },
            3,
        ),
        # a container without a cgroup namespace sees the host's path, its mount is its own
        ("0::/docker/4f1c\n", {"cpu.max": "100000 100000"}, 1),
    ],
    ids=[
        "v2-1.5-cpus",
        "v2-half-a-cpu",
        "v2-max",
        "v2-none",
        "v1-4-cpus",
        "v1-unlimited",
        "v2-slurm-parent-binds",
        "v2-slurm-leaf-only",
        "v1-systemd-slice",
        "v2-no-cgroupns",
    ],
)
def test_the_cgroup_quota_bounds_the_cpus_a_pool_starts(tmp_path, proc_cgroup, files, want):
    mount, proc = tmp_path / "cgroup", tmp_path / "proc_self_cgroup"
    mount.mkdir()
    proc.write_text(proc_cgroup)
    for name, text in files.items():
        (mount / name).parent.mkdir(parents=True, exist_ok=True)
        (mount / name).write_text(text + "\n")
    assert host_cpus.cgroup_quota(str(mount), str(proc)) == want
    if want == 1:  # a quota of one CPU starts one thread, whatever the affinity allows
        assert host_cpus.usable_cpus(str(mount), str(proc)) == 1
    if want is None:  # no quota: the affinity decides
        assert host_cpus.usable_cpus(str(mount), str(proc)) == len(os.sched_getaffinity(0))


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
