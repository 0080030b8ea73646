"""Device mesh, logical-axis rules, and the checks that turn bad layouts into one-line errors.

The mesh has three axes: `data` (pure data parallelism), `fsdp` (data parallelism with
parameters and optimizer state sharded too) and `tensor` (heads / MLP / vocab split across
devices). Within a slice the sizes come from `config.mesh.ici`, across slices from
`config.mesh.dcn`; -1 fills with what is left.
"""

import contextlib
import math

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from maelm_jax.config.run_config import ConfigError, MeshConfig, RunConfig
from maelm_jax.model.logical_axes import ALL_AXES

MESH_AXES = ("data", "fsdp", "tensor")

# Which config value a sharded parameter dimension comes from, for error messages.
_AXIS_SOURCE = {
    "vocab": "the padded vocab size",
    "embed": "model.hidden_size",
    "mlp": "model.mlp_dim (or model.hidden_size in the LM head)",
    "heads": "model.num_heads",
    "kv": "the head dim (hidden_size / num_heads)",
    "position": "model.max_positions",
    "relpos_buckets": "model.relative_attention_buckets",
    "layers": "the layer count",
}


def _fill(parallelism: tuple[tuple[str, int], ...], total: int, name: str) -> tuple[int, ...]:
    sizes = [int(dict(parallelism)[a]) for a in MESH_AXES]
    shown = ", ".join(f"{a}={s}" for a, s in zip(MESH_AXES, sizes, strict=True))
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ConfigError(f"{name}=({shown}) is not allowed: sizes must be >= 1, at most one -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if total % known:
            raise ConfigError(f"{name}=({shown}) cannot fill {total} devices: {known} ∤ {total}")
        sizes[sizes.index(-1)] = total // known
    if math.prod(sizes) != total:
        raise ConfigError(
            f"{name}=({shown}) uses {math.prod(sizes)} devices but there are {total}; make the "
            "product match or set one axis to -1"
        )
    return tuple(sizes)


def create_mesh(config: MeshConfig, devices=None) -> Mesh:
    """A ('data', 'fsdp', 'tensor') mesh; hybrid (ICI x DCN) when devices span slices."""
    devices = list(jax.devices() if devices is None else devices)
    num_slices = len({getattr(d, "slice_index", 0) for d in devices})
    ici = _fill(config.ici, len(devices) // num_slices, "mesh.ici")
    dcn = _fill(config.dcn, num_slices, "mesh.dcn")
    if num_slices > 1:
        grid = mesh_utils.create_hybrid_device_mesh(
            ici, dcn, devices, allow_split_physical_axes=True
        )
    elif devices[0].platform == "cpu":
        grid = np.asarray(devices).reshape(ici)  # simulated devices have no topology
    else:
        grid = mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
    return Mesh(grid, MESH_AXES)


def axis_rules(config: MeshConfig) -> tuple:
    """`config.logical_axis_rules` checked: known names, one rule each, real mesh axes."""
    rules = config.logical_axis_rules
    seen = {}
    for name, target in rules:
        if name not in ALL_AXES:
            raise ConfigError(
                f"logical_axis_rules names unknown logical axis {name!r}; known: {ALL_AXES}"
            )
        if name in seen:
            raise ConfigError(
                f"logical_axis_rules maps {name!r} twice ({seen[name]!r} and {target!r}); "
                "give each logical axis exactly one rule"
            )
        seen[name] = target
        targets = (target,) if isinstance(target, str) or target is None else tuple(target)
        for mesh_axis in targets:
            if mesh_axis is not None and mesh_axis not in MESH_AXES:
                raise ConfigError(
                    f"logical_axis_rules maps {name!r} to unknown mesh axis {mesh_axis!r}; "
                    f"mesh axes are {MESH_AXES}"
                )
        if len(set(targets)) != len(targets):
            raise ConfigError(f"logical_axis_rules maps {name!r} to {target!r}: repeated axis")
    missing = [a for a in ALL_AXES if a not in seen]
    if missing:
        raise ConfigError(
            f"logical_axis_rules has no rule for logical axes {missing}; add one (None to "
            "replicate) for each"
        )
    return rules


def _mesh_axes(rules, logical_name) -> tuple[str, ...]:
    target = dict(rules)[logical_name]
    return () if target is None else (target,) if isinstance(target, str) else tuple(target)


def num_shards(mesh: Mesh, rules, logical_name: str) -> int:
    """How many ways the rules split logical axis `logical_name` over `mesh`."""
    return math.prod(mesh.shape[a] for a in _mesh_axes(rules, logical_name))


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
    """[B, L] batches: rows split as the `activation_batch` rule says."""
    return NamedSharding(mesh, PartitionSpec(_mesh_axes(rules, "activation_batch") or None))


def check_batch(config: RunConfig, mesh: Mesh, rules) -> None:
    """The global batch (and each micro-batch) must split evenly over batch shards and hosts."""
    axes = _mesh_axes(rules, "activation_batch")
    shards = num_shards(mesh, rules, "activation_batch")
    micro = config.batch_size // config.loop.grad_accum_steps
    if micro % shards:
        detail = ", ".join(f"{a}={mesh.shape[a]}" for a in axes)
        raise ConfigError(
            f"batch_size={config.batch_size} (per micro-batch {micro}) is not divisible by "
            f"the {shards} batch shards ({detail}); use a multiple of {shards}"
        )
    if config.batch_size % jax.process_count():
        raise ConfigError(
            f"batch_size={config.batch_size} is not divisible by the process count "
            f"{jax.process_count()}"
        )


def check_divisible(logical_specs, shapes, mesh: Mesh, rules) -> None:
    """Every sharded parameter dimension must split evenly over its mesh axes."""
    specs = jax.tree_util.tree_leaves_with_path(
        logical_specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )
    for (path, spec), shape in zip(specs, jax.tree_util.tree_leaves(shapes), strict=True):
        for logical_name, size in zip(spec, shape.shape, strict=False):
            if logical_name is None:
                continue
            axes = _mesh_axes(rules, logical_name)
            shards = num_shards(mesh, rules, logical_name)
            if size % shards:
                where = ", ".join(f"{a}={mesh.shape[a]}" for a in axes)
                raise ConfigError(
                    f"{_AXIS_SOURCE.get(logical_name, logical_name)} = {size} is not "
                    f"divisible by mesh {where} (parameter {jax.tree_util.keystr(path)}, "
                    f"logical axis {logical_name!r}); choose sizes that divide evenly"
                )


def shardings(logical_specs, mesh: Mesh, rules):
    """Logical PartitionSpecs -> NamedShardings on `mesh`."""
    return nn.logical_to_mesh_sharding(logical_specs, mesh, rules)


@contextlib.contextmanager
def activate(mesh: Mesh, rules):
    """The one context every trace runs in: the mesh plus the logical-axis rules, so the
    model's `with_logical_constraint` calls resolve to this mesh."""
    with jax.sharding.set_mesh(mesh), nn.logical_axis_rules(rules):
        yield
