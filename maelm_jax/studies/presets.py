"""`--preset`: the study's flags at one scale, as defaults for the flags a user did not give.

`cpu` (the default) is the scale a 2-core CPU runs in about 40 minutes (configs/study/*.py).
`gpu` is the scale measured on one H200 on 2026-11-28 (configs/study/gpu_scale/*.py), with
a fine-tuning budget that lets one run of MLM, MAE-LM and random init, three seeds each,
finish in 9 minutes: a GPU is often at hand for 15, on a fresh machine each time. 3ML-self
and -cross are a second run (`--configs=` their two files, another `--study_dir`).

The gpu preset's budget, from the 2026-11-28 logs (m: measured, e: estimated):
  corpus 1 s (m), pretraining 82 + 99 s with compile (m), export 32 + 2 s (m: the first
  compiles the parity check), rank 43 + 9 s (m: likewise), start-up, GLUE and the table
  ~15 s (e): 283 s.
  Fine-tuning, 36 runs (3 rows x 4 tasks x 3 seeds) at ~45 steps/s (m, eager) and ~3 s of
  set-up and scoring a run (m): 36 x (3 + max_steps / 45) s.
  max_steps = 150: 36 x 6.3 = 228 s; in all 511 s, 8 min 31 s, 29 s to spare.
  max_steps = 200 would take 268 s: 551 s, past the 9 minutes.
RoBERTa's 10 epochs stay the schedule's length, but the cap binds on every task: 150 steps
of 32 rows are 0.56 of an epoch of CoLA, 0.07 of SST-2, 1.9 of RTE and 0.83 of STS-B. A
faster fine-tuning loop (issue #63 asks for >= 150 steps/s) buys 600 to 900 steps a run in
the same 9 minutes (3 or 1 s of set-up a run): raise `--max_steps` then.

A flag given on the command line always wins (absl's `present`): `--preset=gpu --seeds=1`
is the gpu preset with one seed.

`--preset=gpu` where JAX would run on the CPU alone is refused unless `--allow_slow_preset`
is given: on a 2-core CPU its two 3000-step pretrainings take 15 to 20 s a step,
more than a day, and nothing else would say so.
"""

import os

from absl import flags, logging

from maelm_jax.config.run_config import ConfigError

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT = "cpu"


def _configs(folder: str, *names: str) -> list[str]:
    return [os.path.join(_REPO, "configs", folder, f"{n}.py") for n in names]


PRESETS = {
    "cpu": {
        "configs": _configs("study", "mlm", "mae_lm", "three_ml_self", "three_ml_cross"),
        "tasks": "cola,sst2,rte,stsb",
        "seeds": ["1", "2", "3"],
        "learning_rates": ["1e-3"],
        "batch_sizes": ["32"],
        "epochs": 3.0,
        "max_steps": 100,
        "max_seq_length": 64,
    },
    "gpu": {
        "configs": _configs("study/gpu_scale", "mlm", "mae_lm"),
        "tasks": "cola,sst2,rte,stsb",
        "seeds": ["1", "2", "3"],
        "learning_rates": ["1e-4"],
        "batch_sizes": ["32"],
        "epochs": 10.0,
        "max_steps": 150,
        "max_seq_length": 128,
    },
}


# What a preset is sized for, said where it is refused.
SIZED_FOR = {"gpu": "one H200 GPU (MLM, MAE-LM and random init in about 9 minutes)"}
ALLOW_SLOW_FLAG = "allow_slow_preset"


def check_machine(flag_values: flags.FlagValues) -> None:
    """Refuses a preset sized for an accelerator where JAX would run on the CPU alone (told
    before any backend starts), unless `--allow_slow_preset` asks for it anyway."""
    name = flag_values.preset
    if name not in SIZED_FOR or flag_values[ALLOW_SLOW_FLAG].value:
        return
    from maelm_jax.hardware import platforms

    reason = platforms.cpu_only()
    if reason:
        raise ConfigError(
            f"--preset={name} is sized for {SIZED_FOR[name]}, but JAX would run on the CPU "
            f"here ({reason}), where it takes more than a day on 2 cores: give --preset=cpu, "
            f"or --{ALLOW_SLOW_FLAG} to run it anyway"
        )


def apply(flag_values: flags.FlagValues) -> dict:
    """Sets every flag of `--preset`'s that the command line did not give; returns (and
    logs) those it changed. An unknown preset is refused, naming the ones there are."""
    name = flag_values.preset
    if name not in PRESETS:
        raise ConfigError(f"--preset={name}: no such preset; give one of {', '.join(PRESETS)}")
    chosen = {
        k: v
        for k, v in PRESETS[name].items()
        if not flag_values[k].present and flag_values[k].value != v
    }
    for key, value in chosen.items():
        setattr(flag_values, key, value)
    if chosen:
        shown = " ".join(
            f"--{k}={','.join(v) if isinstance(v, list) else v}" for k, v in chosen.items()
        )
        logging.info("study: --preset=%s sets %s", name, shown)
    return chosen
