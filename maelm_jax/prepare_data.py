"""`python -m maelm_jax.prepare_data --config=configs/<name>.py [--data_dir=gs://...]
[--num_shards=16] [--workers=N] [--beam_options=runner=DirectRunner,...] [--json]`.

Run once, on one machine, before a pod is launched: prepares the config's dataset, trains
its SentencePiece model, tokenizes and packs the corpus into `--num_shards` shards of
`seq_len` blocks with `--workers` processes, and writes the corpus statistics next to the
data (`maelm_jax/data/preparation.py` says what and how). Every run with the same data keys
and seq_len then reads those blocks, whatever its method or size. A rerun changes nothing
but missing or corrupt shards (rebuilt); an interrupted one resumes.
"""

import json

from absl import app, flags
from ml_collections import config_flags

from maelm_jax.config import cli, configdict, paths
from maelm_jax.data.preparation import NUM_SHARDS, prepare


def format_report(r: dict) -> str:
    rows = [
        ("dataset", r["dataset"]),
        ("prepared in", r["prepared_dir"]),
        ("this run", "built it" if r["built"] else "already prepared: nothing done"),
        ("tokenizer", f"{r['vocab_size']} pieces, sha256 {r['tokenizer_sha256'][:12]}"),
        ("documents", f"{r['documents']:,}"),
        ("tokens", f"{r['tokens']:,} ({r['tokens'] / r['documents']:,.0f} per document)"),
        (f"blocks of {r['seq_len']}", f"{r['blocks']:,} train, {r['eval_blocks']:,} eval"),
        ("shards", f"{r['num_shards']} of {r['dtype']} in {r['blocks_dir']}"),
        (
            "packed",
            f"{r['text_bytes'] / 1e6:,.1f} MB of text in {r['pack_seconds']:.1f}s on "
            f"{r['pack_workers']} workers",
        ),
        ("unigram entropy", f"{r['unigram_entropy_bits']:.3f} bits/token"),
        ("distinct tokens", f"{r['distinct_tokens']:,}"),
    ]
    return "\n".join(f"{k:<16} {v}" for k, v in rows)


FLAGS = flags.FLAGS


def define_flags() -> None:
    """Called by `__main__` only, so tests can import this module beside other commands."""
    config_flags.DEFINE_config_file("config", None, "Path to a config file.", lock_config=True)
    flags.DEFINE_string("data_dir", None, "Replaces config.data_dir (local, file:// or gs://).")
    flags.DEFINE_integer(
        "num_shards", NUM_SHARDS, "Shards per split; each host reads num_shards / hosts.", 1
    )
    flags.DEFINE_integer(
        "workers",
        None,
        "Packing processes; default: one per 16 MB of text, at most one per core.",
        1,
    )
    flags.DEFINE_string(
        "beam_options",
        None,
        "A TFDS Beam builder's pipeline options, as `tfds build --beam_pipeline_options` "
        "takes them: runner=DirectRunner,direct_num_workers=8 or runner=DataflowRunner,...",
    )
    flags.DEFINE_boolean("json", False, "Print one JSON object instead of the table.")
    flags.mark_flags_as_required(["config"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    config = FLAGS.config
    if FLAGS.data_dir:
        config.data_dir = paths.resolve(FLAGS.data_dir)
    report = prepare(
        configdict.freeze(config).data,
        FLAGS.num_shards,
        FLAGS.workers,
        beam_options=FLAGS.beam_options,
    )
    print(json.dumps(report) if FLAGS.json else format_report(report))


if __name__ == "__main__":
    define_flags()
    cli.run(main, prog="maelm_jax.prepare_data")
