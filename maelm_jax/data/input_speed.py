"""What `python -m maelm_jax.bench input` measures: how fast the input side is, on a
synthetic corpus of a given size, so that the numbers can be compared across machines.

* delivered tokens/s: one host's pipeline on a prepared corpus (its shards mapped, batches
  drawn through the prefetch thread exactly as training draws them). The pipeline is one
  thread, so this is also the rate per core;
* prepare throughput: MB of text the tokenize-and-pack job turns into shards per second
  per worker process (tokenizer training, a fixed cost, not included);
* startup and peak RSS of a 2-step run (a new workdir, the real CLI in a subprocess; the
  peak RSS is that process's VmHWM), with and without the prepared corpus: the same command
  without one prepares it first (tokenizer and shards), as `prepare_data` would.
"""

import os
import pathlib
import subprocess
import tempfile
import time

import numpy as np

from maelm_jax.config.run_config import DataConfig
from maelm_jax.data.batches import TrainBatches
from maelm_jax.data.input_pipeline import create_datasets
from maelm_jax.data.tokenizer import Tokenizer

_SYLLABLES = ("ka", "lo", "mi", "ten", "ar", "vo", "si", "ne", "ru", "dal", "pe", "to", "sh")


def write_synthetic_corpus(directory: pathlib.Path, megabytes: float, files: int = 32) -> str:
    """`megabytes` of English-shaped text (Zipf-distributed words, sentences, documents of
    a few paragraphs separated by blank lines) in `files` files; its `text:` glob."""
    rng = np.random.default_rng(0)
    words = np.array(["".join(rng.choice(_SYLLABLES, rng.integers(1, 4))) for _ in range(20_000)])
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    directory.mkdir(parents=True, exist_ok=True)
    per_file = int(megabytes * 1e6 / files)
    for f in range(files):
        parts, size = [], 0
        while size < per_file:
            sentence_words = rng.choice(words, size=(40, 14), p=weights)
            sentences = [" ".join(s).capitalize() + "." for s in sentence_words]
            document = "\n".join(" ".join(sentences[i : i + 5]) for i in range(0, 40, 5))
            parts.append(document + "\n\n")
            size += len(parts[-1])
        (directory / f"part{f:03d}.txt").write_text("".join(parts))
    return f"text:{directory}/*.txt"


def delivered_tokens_per_s(config: DataConfig, tokenizer: Tokenizer, rows: int, steps: int) -> dict:
    """Tokens per second one host's pipeline delivers: `steps` batches of `rows` blocks of
    this host (process 0 of 1) through the prefetch thread, after opening it."""
    start = time.perf_counter()
    data = create_datasets(config, tokenizer, 0, 1)
    opened = time.perf_counter() - start
    batches = TrainBatches(data.train.blocks, rows, config.seed, 0).iterate(0)
    next(batches)  # the thread started
    start = time.perf_counter()
    with batches:
        for _ in range(steps):
            next(batches)
    seconds = time.perf_counter() - start
    return {
        "open_seconds": round(opened, 3),
        "rows": rows,
        "seq_len": config.seq_len,
        "steps": steps,
        "tokens_per_sec": rows * config.seq_len * steps / seconds,
        "train_blocks": data.train_blocks,
    }


def _high_water_mb(pid: int) -> float | None:
    """VmHWM of a live process: the peak RSS of its own memory since its exec. (The
    `ru_maxrss` that `wait4` reports would start from this parent's peak, which the exec'd
    child inherits on Linux.)"""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def run_and_measure(argv: list[str], cwd: pathlib.Path, env: dict | None = None) -> dict:
    """Runs `argv` to its end: wall seconds, its peak RSS in MB (polled every 50 ms, so a
    process that ends sooner reads 0) and exit status."""
    start = time.perf_counter()
    peak = 0.0
    with open(os.devnull, "w") as devnull, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=devnull, stderr=err)
        while proc.poll() is None:
            peak = max(peak, _high_water_mb(proc.pid) or 0.0)
            time.sleep(0.05)
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    return {
        "seconds": round(time.perf_counter() - start, 1),
        "peak_rss_mb": round(peak, 1),
        "returncode": proc.returncode,
        "error": lines[-1] if proc.returncode and lines else "",
    }


def format_result(r: dict) -> str:
    """The table `bench input` prints."""
    lines = [
        f"delivered: {r['delivered']['tokens_per_sec']:,.0f} tokens/s from one host's "
        f"pipeline ({r['delivered']['rows']} x {r['delivered']['seq_len']} per batch, one "
        "thread)",
    ]
    if "consumed" in r:
        c = r["consumed"]
        lines.append(
            f"consumed:  {c['tokens_per_sec']:,.0f} tokens/s per {c['host']} host by "
            f"{c['config']} at {c['mfu']:.0%} of peak: delivered is "
            f"{r['delivered']['tokens_per_sec'] / c['tokens_per_sec']:.1f}x that"
        )
    lines += [
        "",
        "| text MB | prepare MB/s/core | prepare s (workers) | startup s: unprepared -> "
        "prepared | peak RSS MB: unprepared -> prepared |",
        "|---|---|---|---|---|",
    ]
    for row in r["sizes"]:
        p, before, after = row["prepare"], row["unprepared_run"], row["prepared_run"]
        lines.append(
            f"| {row['text_mb']:.1f} | {p['mb_per_s_per_core']:.2f} | {p['seconds']:.1f} "
            f"({p['workers']}) | {before['seconds']:.1f} -> {after['seconds']:.1f} "
            f"| {before['peak_rss_mb']:,.0f} -> {after['peak_rss_mb']:,.0f} |"
        )
    return "\n".join(lines)
