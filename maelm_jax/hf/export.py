"""A checkpoint as a HuggingFace model directory, verified before it appears.

Writes a HuggingFace model directory (config.json, float32 model.safetensors, tokenizer,
model card) from a checkpoint, then proves it: the JAX encoder and the reloaded PyTorch model
run on the same padded batch and the command fails unless their final hidden states (and
MLM logits) agree to `TOLERANCE`. The directory appears at OUT only once parity holds.

Which class: an encoder without the relative position bias is exactly `RobertaModel`; MLM
runs keep their LM head (`RobertaForMaskedLM`). MAE-LM / 3ML runs export the encoder alone:
their LM head was trained on the decoder's outputs, so it is meaningless on the encoder's.
An encoder with the bias ships `modeling_maelm.py` (`trust_remote_code=True`). The modern
backbone exports as transformers' own `ModernBertModel` / `ModernBertForMaskedLM`
(hf/modern_convert.py), which load without remote code.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import tempfile
import uuid

import numpy as np

from maelm_jax.config import paths
from maelm_jax.config.run_config import ConfigError, ModelConfig
from maelm_jax.hf import convert as hf_convert
from maelm_jax.hf import modern_convert
from maelm_jax.inspection import trained_model

TOLERANCE = 1e-4
MODELING_FILE = "modeling_maelm.py"
# Parity inputs: different lengths, so the batch is padded; one long enough to be cut.
PARITY_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Masked language models learn from text with some tokens hidden.",
    "Short.",
    "A longer sentence, with punctuation; numbers like 12345 and 3.14; and a word that is "
    "repeated, repeated, repeated until the row is longer than any other row in the batch.",
    "naïve café — 東京",
)


@dataclasses.dataclass(frozen=True)
class ExportResult:
    output_dir: str
    hf_class: str
    objective: str
    step: int
    max_abs_diff_hidden: float
    max_abs_diff_logits: float | None


def _kind(config) -> str:
    if config.objective == "mlm":
        return "mlm"
    return f"3ml_{config.model.decoder}" if config.model.decoder == "cross" else "mae_lm"


def exported_class(objective: str, cfg: ModelConfig) -> str:
    """The HuggingFace class an export of this model is saved as (config.json's
    `architectures`): the one place docs/export.md's table is checked against."""
    converter = modern_convert if cfg.modern else hf_convert
    return converter.hf_config(cfg, 0, objective == "mlm")["architectures"][0]


def check_exportable(trained: trained_model.TrainedModel) -> None:
    """ConfigError unless the export represents this encoder exactly.

    A model setting the converter does not know (a feature added after it) is refused by
    name, never dropped: e.g. segment-isolated attention must be declared meaningless for a
    single-document input (which it is) before such runs export.
    """
    unknown = sorted(
        set(hf_convert.unsupported_fields(trained.model_config))
        # keys of the stored config that this version's ModelConfig may not even have
        | (set(json.loads(trained.config.source_json)["model"]) - hf_convert.REPRESENTED_FIELDS)
    )
    if unknown:
        raise ConfigError(
            f"model setting(s) {unknown} of {trained.step_dir} are not represented by the "
            f"HuggingFace export; it represents exactly {sorted(hf_convert.REPRESENTED_FIELDS)}"
        )


def parity_batch(trained: trained_model.TrainedModel) -> np.ndarray:
    """[len(PARITY_TEXTS) (+ 1), T] int32 `<s> ... </s>` rows, right-padded with `<pad>`.
    The modern backbone gets one more row, longer than its local window where the model
    allows it, so that the local layers' window is exercised."""
    tok, cfg = trained.tokenizer, trained.model_config
    limit = cfg.max_positions
    texts = list(PARITY_TEXTS)
    if cfg.modern:
        long_row = " ".join(PARITY_TEXTS)
        while len(tok.encode(long_row)) < min(cfg.local_attention + 32, limit):
            long_row += " " + " ".join(PARITY_TEXTS)
        texts.append(long_row)
    rows = [[tok.bos_id, *tok.encode(t)[: limit - 2], tok.eos_id] for t in texts]
    batch = np.full((len(rows), max(map(len, rows))), tok.pad_id, np.int32)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = row
    return batch


def parity_fn(trained: trained_model.TrainedModel, with_lm_head: bool):
    """(params, ids, positions) -> (hidden, logits or None): the JAX side of the parity, at
    full float32 precision on any device (trained_model.FullPrecisionJit)."""

    def run(module, ids, positions):
        hidden = module.encode(ids, positions)
        logits = module.lm_head(hidden, module.token_embed) if with_lm_head else None
        return hidden, logits

    return trained_model.FullPrecisionJit(
        lambda p, i, q: trained.model.apply({"params": p}, i, q, method=run)
    )


def jax_outputs(trained: trained_model.TrainedModel, ids: np.ndarray, with_lm_head: bool):
    """(hidden [B, T, E], logits [B, T, V] or None) of the JAX model in float32."""
    positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
    hidden, logits = parity_fn(trained, with_lm_head)(trained.params, ids, positions)
    vocab = trained.tokenizer.vocab_size
    return np.asarray(hidden), None if logits is None else np.asarray(logits)[..., :vocab]


def torch_outputs(model_dir: str, ids: np.ndarray, with_lm_head: bool, remote_code: bool):
    """The same from the directory as transformers loads it (CPU, float32)."""
    import torch
    from transformers import AutoModel, AutoModelForMaskedLM

    auto = AutoModelForMaskedLM if with_lm_head else AutoModel
    model = auto.from_pretrained(model_dir, trust_remote_code=remote_code).eval()
    input_ids = torch.from_numpy(ids.astype(np.int64))
    with torch.no_grad():
        valid = input_ids != model.config.pad_token_id
        hidden = model.base_model(input_ids, attention_mask=valid).last_hidden_state
        logits = model(input_ids, attention_mask=valid).logits if with_lm_head else None
    return hidden.numpy(), None if logits is None else logits.numpy()


def max_abs_diff(a: np.ndarray, b: np.ndarray, valid: np.ndarray) -> float:
    """Largest |a - b| over the non-padding positions (padding rows are never attended)."""
    return float(np.max(np.abs(a - b)[valid]))


def _model_card(trained, hf_class: str, result_json: dict, remote_code: bool) -> str:
    c = trained.config
    tokens = trained.step * c.batch_size * c.seq_len
    load = "trust_remote_code=True" if remote_code else ""
    head = (
        "encoder + LM head (`AutoModelForMaskedLM`, `pipeline('fill-mask')`)"
        if c.objective == "mlm"
        else "encoder only: the decoder and the LM head, trained on the decoder's outputs, "
        "were pretraining devices and are dropped"
    )
    fine_tune = (
        f"- Fine-tune: `AutoModelForSequenceClassification` and `AutoModelForQuestionAnswering`"
        f" (start/end head, `run_qa.py`){' with ' + load if load else ''}: a fresh head on "
        "the pretrained encoder.\n"
    )
    no_fill_mask = (
        ""
        if c.objective == "mlm"
        else "- No fill-mask: this encoder never predicted tokens (its decoder did), so there is "
        "no LM head to export, and `AutoModelForMaskedLM` / `pipeline('fill-mask')` would "
        "predict from a freshly initialised head. "
        + (
            "The export's `auto_map` leaves `AutoModelForMaskedLM` out, so with "
            '`trust_remote_code=True` it stops with "Unrecognized configuration class ... '
            'MaelmConfig" (without remote code transformers builds a plain `RobertaForMaskedLM`: '
            "no relative bias, random head)."
            if remote_code
            else "transformers still builds one (its own class for this `model_type`) and only "
            "warns that the head's weights are newly initialized: do not use it."
        )
        + "\n"
    )
    return f"""# maelm_jax export: {_kind(c)}, step {trained.step}

- Objective: `{c.objective}` (decoder `{c.model.decoder}`), exported as `{hf_class}`.
- Contents: {head}.
- Trained {trained.step} steps of {c.batch_size} x {c.seq_len} tokens
  ({tokens:,} token slots seen) on `{c.data.dataset}`.
- Parity with the JAX model (float32, CPU, {len(PARITY_TEXTS)} padded sentences): max |diff|
  hidden {result_json["max_abs_diff_hidden"]:.3g}, logits {result_json["max_abs_diff_logits"]}.
- Load: `AutoModel.from_pretrained(path{", " + load if load else ""})`,
  `AutoTokenizer.from_pretrained(path)`. Inputs are one document per row (`<s> ... </s>`).
{fine_tune}{no_fill_mask}
## Model config

```json
{json.dumps(json.loads(c.source_json)["model"], indent=1, sort_keys=True)}
```
"""


def export(workdir, output_dir, step: int | None = None) -> ExportResult:
    """Writes `output_dir` (local, `file://` or a cloud URL such as gs://) and checks parity;
    ConfigError if the checkpoint cannot be exported exactly or the output directory is in
    the way, RuntimeError on a parity miss.

    transformers reloads only local directories, so a cloud destination is built and
    verified in a local temporary directory first and uploaded only once parity holds.
    """
    if not paths.is_remote(output_dir):
        return _export_local(workdir, paths.resolve(output_dir), step)
    dest = paths.path(output_dir)
    if dest.exists() and any(dest.iterdir()):
        raise ConfigError(f"output_dir={output_dir!r} exists and is not empty; give a new one")
    with tempfile.TemporaryDirectory() as local:
        result = _export_local(workdir, os.path.join(local, "export"), step)
        dest.mkdir(parents=True, exist_ok=True)
        for name in sorted(os.listdir(result.output_dir)):
            (dest / name).write_bytes(pathlib.Path(result.output_dir, name).read_bytes())
    return dataclasses.replace(result, output_dir=os.fspath(output_dir))


def _export_local(workdir, output_dir: str, step: int | None) -> ExportResult:
    from safetensors.numpy import save_file

    from maelm_jax.hf.tokenizer import hf_tokenizer

    out = os.path.abspath(os.fspath(output_dir))
    if os.path.exists(out) and os.listdir(out):
        raise ConfigError(f"output_dir={output_dir!r} exists and is not empty; give a new one")
    trained = trained_model.load(workdir, step)
    check_exportable(trained)
    cfg, vocab = trained.model_config, trained.tokenizer.vocab_size
    with_lm_head = trained.config.objective == "mlm"
    remote_code = hf_convert.uses_relative_bias(cfg)
    converter = modern_convert if cfg.modern else hf_convert
    hf_cfg = converter.hf_config(cfg, vocab, with_lm_head)
    hf_class = exported_class(trained.config.objective, cfg)

    tmp = f"{out}.tmp-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=1)
    weights = converter.state_dict(trained.params, cfg, vocab, with_lm_head)
    save_file(weights, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    hf_tokenizer(trained.tokenizer, cfg.max_positions).save_pretrained(tmp)
    if remote_code:
        here = os.path.dirname(os.path.abspath(__file__))  # maelm_jax/hf/
        shutil.copyfile(os.path.join(here, "modeling.py"), os.path.join(tmp, MODELING_FILE))

    ids = parity_batch(trained)
    valid = ids != trained.tokenizer.pad_id
    jax_hidden, jax_logits = jax_outputs(trained, ids, with_lm_head)
    pt_hidden, pt_logits = torch_outputs(tmp, ids, with_lm_head, remote_code)
    result = ExportResult(
        output_dir=out,
        hf_class=hf_class,
        objective=_kind(trained.config),
        step=trained.step,
        max_abs_diff_hidden=max_abs_diff(jax_hidden, pt_hidden, valid),
        max_abs_diff_logits=None
        if jax_logits is None
        else max_abs_diff(jax_logits, pt_logits, valid),
    )
    worst = max(result.max_abs_diff_hidden, result.max_abs_diff_logits or 0.0)
    if not worst <= TOLERANCE:
        raise RuntimeError(
            f"parity failed: max |JAX - PyTorch| = {worst:.3g} > {TOLERANCE} (hidden "
            f"{result.max_abs_diff_hidden:.3g}, logits {result.max_abs_diff_logits}); the "
            f"unverified export is left in {tmp}"
        )
    with open(os.path.join(tmp, "README.md"), "w") as f:
        f.write(_model_card(trained, hf_class, dataclasses.asdict(result), remote_code))
    if os.path.exists(out):
        os.rmdir(out)  # empty, checked above
    os.rename(tmp, out)
    return result


def format_result(r: ExportResult) -> str:
    logits = "n/a (no LM head)" if r.max_abs_diff_logits is None else f"{r.max_abs_diff_logits:.3g}"
    rows = [
        ("output_dir", r.output_dir),
        ("hf_class", r.hf_class),
        ("objective", r.objective),
        ("step", str(r.step)),
        ("max |diff| hidden", f"{r.max_abs_diff_hidden:.3g}"),
        ("max |diff| logits", logits),
        ("parity", f"ok (<= {TOLERANCE})"),
    ]
    return "\n".join(f"{k:<18} {v}" for k, v in rows)
