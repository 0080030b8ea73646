"""What MAE-LM and 3ML save over MLM, per step (`python -m maelm_jax.flops`).

For the model size, sequence length and batch of `--config`, builds the train step of every
method (`METHODS`: mlm, mae_lm, 3ml_self, 3ml_cross with the paper configs' mask rates,
decoders and relative bias, or all at `--mask_rate`) and prints one row each: FLOPs per
step by region, XLA's total, the analytic total (`flop_count`), the ratio to mlm, bytes
accessed and FLOPs per token.

XLA's numbers: the total is the cost analysis of the whole train step (masking, forward,
backward, clipping, AdamW), compiled with the layers unrolled and no rematerialisation, since
XLA counts a loop body once and recomputation is not model work. XLA reports totals only,
so each region's column is a program of its own: the region's forward + backward (the
token-embedding lookup; the encoder incl. position embedding and relative bias; the decoder
incl. its [MASK] slots; LM head + cross-entropy; the AdamW update), compiled alone with the
shapes that region sees in the step. `other` is the step's total minus the regions: masking,
the masked-position gathers between regions, the gradient norm and the finite check; a few
percent at most (the tests hold it there). Without `--topology` everything compiles for one
local CPU device; with it, for the slice's compile-only TPU devices (libtpu; no TPU needed):
the total is the sharded step's per-device count times the devices, a region is compiled on
one chip with one chip's share of the batch and multiplied by the chips.

The analytic total counts matmuls only; XLA adds the elementwise work (LayerNorm, GELU,
softmax, dropout, the loss), so XLA / analytic lies in [1, 1 + flop_count.TOLERANCE]:
about 1.05 at base size and seq 512, up to ~1.2 for tiny test models.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from maelm_jax.aot import compile_step as aot
from maelm_jax.config import configdict
from maelm_jax.config.run_config import ConfigError, RunConfig
from maelm_jax.model import flop_count, loss
from maelm_jax.model.masked_lm import init_inputs
from maelm_jax.step import optimizer, programs

# method -> (objective, mask_rate, decoder, decoder layers, relative position buckets):
# the paper configs (configs/mlm_base.py, mae_lm_base.py, three_ml_*_base.py).
METHODS = {
    "mlm": ("mlm", 0.15, "self", 0, 0),
    "mae_lm": ("mae_lm", 0.15, "self", 4, 64),
    "3ml_self": ("mae_lm", 0.5, "self", 2, 0),
    "3ml_cross": ("mae_lm", 0.5, "cross", 2, 0),
}
COLUMNS = (*flop_count.REGIONS, "other")


def method_config(run: RunConfig, method: str, mask_rate: float | None) -> RunConfig:
    """`run`'s sizes, sequence and batch with `method`'s objective, masking and decoder;
    layers unrolled and no remat, so XLA counts every layer's model FLOPs once."""
    objective, rate, decoder, layers, buckets = METHODS[method]
    if run.model.modern:
        buckets = 0  # rotary positions: the modern backbone has no relative bias
    return configdict.override(
        aot.counting_config(run),
        {
            "objective": objective,
            "mask_rate": rate if mask_rate is None else mask_rate,
            "model.decoder": decoder,
            "model.num_decoder_layers": layers or 1,  # unused by mlm, but validated
            "model.relative_attention_buckets": buckets,
            "model.remat_policy": "none",
            "model.decoder_remat_policy": "none",
        },
    )


@dataclasses.dataclass(frozen=True)
class Row:
    method: str
    mask_rate: float
    num_masked: int
    xla_regions: dict  # COLUMNS -> FLOPs per step
    analytic_regions: dict  # flop_count.REGIONS -> FLOPs per step
    xla_total: float
    analytic_total: float
    bytes_accessed: float
    tokens: int  # batch x seq_len
    ratio_to_mlm: float = 0.0
    # XLA's TPU cost model (`optimal_seconds`): an estimate of the step's time on a chip,
    # not a measurement; None where the target has no such model (CPU).
    seconds: float | None = None
    region_seconds: dict | None = None  # COLUMNS -> estimated seconds per step
    time_ratio_to_mlm: float | None = None

    @property
    def xla_over_analytic(self) -> float:
        return self.xla_total / self.analytic_total

    @property
    def flops_per_token(self) -> float:
        return self.xla_total / self.tokens


def _shape(shape, dtype, device):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))


def _forward_backward(fn, argnums):
    """fn(params, *inputs) -> array; the program computes it and the gradients of
    `argnums` for a cotangent of ones (the shape of the real backward pass)."""

    def run(*args):
        out, pull = jax.vjp(lambda *d: fn(*_put(args, argnums, d)), *[args[i] for i in argnums])
        return out, pull(jnp.ones_like(out))

    return run


def _put(args, argnums, values):
    args = list(args)
    for i, v in zip(argnums, values, strict=True):
        args[i] = v
    return args


def region_programs(run: RunConfig, batch: int, device) -> dict:
    """{region: (fn, abstract args)}: each region's forward + backward at `batch` rows, with
    the real modules and parameter shapes of `run`'s model."""
    model, masking_cfg = programs.model_and_masking(run, run.data.vocab_size, device.platform)
    cfg = model.config
    length, k = run.seq_len, masking_cfg.num_masked
    tokens = length if cfg.objective == "mlm" else length - k
    params = nn.meta.unbox(
        jax.eval_shape(model.init, jax.random.PRNGKey(0), *init_inputs(length, k))["params"]
    )
    on_device = lambda tree: jax.tree_util.tree_map(
        lambda x: _shape(x.shape, x.dtype, device), tree
    )
    sub = lambda *names: {n: on_device(params[n]) for n in names}
    ints = lambda *shape: _shape(shape, jnp.int32, device)
    vectors = lambda n: _shape((batch, n, cfg.hidden_size), cfg.dtype, device)
    rngs = {"dropout": jax.random.PRNGKey(0)}

    def call(method, p, *args):
        return model.apply({"params": p}, *args, method=method, rngs=rngs)

    regions = {
        "embedding": (
            _forward_backward(lambda p, i: call(lambda m, i: m.token_embed(i), p, i), (0,)),
            (sub("token_embed"), ints(batch, tokens)),
        ),
        "encoder": (
            _forward_backward(
                lambda p, x, pos, v: call(lambda m, *a: m.encoder(*a, False), p, x, pos, v), (0, 1)
            ),
            (sub("encoder"), vectors(tokens), ints(batch, tokens), ints(batch, tokens)),
        ),
    }
    if cfg.objective == "mae_lm":
        decoder_inputs = (
            (ints(batch, tokens), ints(batch, k), ints(batch, length))  # visible, masked, segs
            if cfg.decoder == "self"
            # segments, visible, masked, masked segments
            else (ints(batch, tokens), ints(batch, tokens), ints(batch, k), ints(batch, k))
        )
        # The `<mask>` row comes from the token embedding (an input here) or is the decoder's.
        row = cfg.mask_token_source == "embedding_row"
        mask_row = (_shape((cfg.hidden_size,), jnp.float32, device),) if row else ()

        def decoder(m, *a):
            *a, vector = a if row else (*a, None)
            return m.decoder(*a, False, vector)

        regions["decoder"] = (
            _forward_backward(lambda p, x, *a: call(decoder, p, x, *a), (0, 1)),
            (sub("decoder"), vectors(tokens), *decoder_inputs, *mask_row),
        )

    def head_loss(p, hidden, labels, weights):
        logits = call(lambda m, h: m.lm_head(h, m.token_embed), p, hidden)
        return loss.masked_lm_sums(logits, labels, weights)["loss_sum"]

    regions["lm_head"] = (
        _forward_backward(head_loss, (0, 1)),
        (
            sub("lm_head", "token_embed"),
            vectors(k),
            ints(batch, k),
            _shape((batch, k), jnp.float32, device),
        ),
    )
    tx = optimizer.create_optimizer(run.optimizer)
    state, opt_state = on_device(params), on_device(jax.eval_shape(tx.init, params))

    def update(p, o, g):
        updates, o = tx.update(g, o, p)
        return optax.apply_updates(p, updates), o

    regions["optimizer"] = (update, (state, opt_state, state))
    return regions


def _region_costs(fn, args, seen: dict) -> dict:
    """XLA's costs of one region's program. Methods share regions (3ML-self and 3ML-cross
    have the same embedding, encoder and LM head): a program lowered to text seen before is
    not compiled again."""
    lowered = jax.jit(fn).lower(*args)
    text = lowered.as_text()
    if text not in seen:
        seen[text] = aot.costs(lowered.compile())
    return seen[text]


def measure(run: RunConfig, method: str, devices, mask_rate=None, seen=None) -> Row:
    """One method's row: the whole step's XLA costs on `devices`, its regions on one.
    `seen`: region costs by program text, shared by the methods of one table."""
    c = method_config(run, method, mask_rate)
    options = aot.NO_WINDOWED_EINSUM if devices[0].platform == "tpu" else None
    compiled, oom, _, _ = aot.compile_step(c, devices, options)
    if compiled is None:
        raise ConfigError(f"the {method} step does not fit in memory: {oom.splitlines()[0]}")
    costs = aot.costs(compiled)
    total = float(costs["flops"]) * len(devices)
    seconds = aot.estimated_seconds(costs)
    xla, times = {}, {}
    per_device = c.batch_size // len(devices)
    regions = region_programs(c, per_device, devices[0])
    seen = {} if seen is None else seen
    for name, (fn, args) in regions.items():
        region = _region_costs(fn, args, seen)
        # A region runs on one chip's share of the batch, as each chip runs it in the step
        # (all chips at once): its FLOPs count every chip, its time one. The optimizer
        # program updates every parameter on one chip; the step shards it over all.
        optimizer = name == "optimizer"
        xla[name] = float(region["flops"]) * (1 if optimizer else len(devices))
        region_time = aot.estimated_seconds(region)
        if region_time is not None:
            times[name] = region_time / (len(devices) if optimizer else 1)
    xla = {name: xla.get(name, 0.0) for name in flop_count.REGIONS}
    xla["other"] = total - sum(xla.values())
    region_seconds = None
    if seconds is not None and len(times) == len(regions):
        region_seconds = {name: times.get(name, 0.0) for name in flop_count.REGIONS}
        region_seconds["other"] = seconds - sum(region_seconds.values())
    analytic = flop_count.region_flops(c, flop_count.num_params(c))
    return Row(
        method=method,
        mask_rate=c.masking.mask_rate,
        num_masked=c.masking.num_masked,
        xla_regions=xla,
        analytic_regions=analytic,
        xla_total=total,
        analytic_total=sum(analytic.values()),
        bytes_accessed=float(costs.get("bytes accessed", 0.0)) * len(devices),
        tokens=c.batch_size * c.seq_len,
        seconds=seconds,
        region_seconds=region_seconds,
    )


def table(run: RunConfig, devices, mask_rate=None, methods=tuple(METHODS)) -> list[Row]:
    seen = {}
    rows = [measure(run, m, devices, mask_rate, seen) for m in methods]
    base, base_seconds = rows[0].xla_total, rows[0].seconds
    return [
        dataclasses.replace(
            r,
            ratio_to_mlm=r.xla_total / base,
            time_ratio_to_mlm=None if r.seconds is None else r.seconds / base_seconds,
        )
        for r in rows
    ]


def format_table(rows: list[Row], header: str) -> str:
    lines = [header, "XLA cost analysis per region (GFLOPs per step); totals XLA vs analytic"]
    head = f"{'method':10} {'mask':>4} {'k':>4}" + "".join(f" {c:>10}" for c in COLUMNS)
    head += f" {'XLA':>10} {'analytic':>10} {'XLA/ana':>7} {'vs mlm':>6} {'GB':>8} {'FLOP/tok':>9}"
    lines.append(head)
    for r in rows:
        line = f"{r.method:10} {r.mask_rate:>4.2f} {r.num_masked:>4}"
        line += "".join(f" {r.xla_regions[c] / 1e9:>10.1f}" for c in COLUMNS)
        line += (
            f" {r.xla_total / 1e9:>10.1f} {r.analytic_total / 1e9:>10.1f}"
            f" {r.xla_over_analytic:>7.3f} {r.ratio_to_mlm:>6.3f}"
            f" {r.bytes_accessed / 1e9:>8.2f} {r.flops_per_token / 1e6:>8.2f}M"
        )
        lines.append(line)
    if all(r.region_seconds for r in rows):
        lines += [
            "XLA's TPU cost model (optimal_seconds), an estimate of one chip's time, not a "
            "measurement (ms per step)",
            f"{'method':10}"
            + "".join(f" {c:>10}" for c in COLUMNS)
            + f" {'step':>10} {'time/mlm':>8} {'FLOPs/mlm':>9} {'excess':>7}",
        ]
        for r in rows:
            lines.append(
                f"{r.method:10}"
                + "".join(f" {r.region_seconds[c] * 1e3:>10.2f}" for c in COLUMNS)
                + f" {r.seconds * 1e3:>10.2f} {r.time_ratio_to_mlm:>8.3f} {r.ratio_to_mlm:>9.3f}"
                + f" {r.time_ratio_to_mlm - r.ratio_to_mlm:>+7.3f}"
            )
    outside = [r.method for r in rows if not 1 <= r.xla_over_analytic <= 1 + flop_count.TOLERANCE]
    lines.append(
        f"XLA/analytic within [1, {1 + flop_count.TOLERANCE:g}]: "
        + ("yes" if not outside else f"NO for {', '.join(outside)}")
    )
    return "\n".join(lines)


def to_json(rows: list[Row], **context) -> dict:
    return dict(
        context,
        tolerance=flop_count.TOLERANCE,
        methods={
            r.method: dict(
                dataclasses.asdict(r),
                xla_over_analytic=r.xla_over_analytic,
                flops_per_token=r.flops_per_token,
            )
            for r in rows
        },
    )
