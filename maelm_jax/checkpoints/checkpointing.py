"""Orbax checkpoints in `WORKDIR/checkpoints/<step>/` that a preempted pod job can trust.

A checkpoint holds the train state (params, optimizer state, step), the data-pipeline
position, the config (JSON) and the tokenizer model, so a run can be resumed or exported
from the checkpoint alone. Saves are asynchronous and every process takes part.

Trust comes from a manifest (`manifest.py`): when all of a step's files are written and
before Orbax commits the step, process 0 adds `maelm_manifest.json`. A step without it,
with a file missing, resized or changed, whose metadata or arrays fail to read, whose
restored arrays do not match their fingerprints, or whose state is not finite, is skipped
for the previous good step; once one is found, the bad ones are renamed to
`<step>.unusable-<reason>` (never deleted) so the resumed run can write those steps again,
each reported in one line (a failed read's abandoned coroutines are ended quietly:
`abandoned_reads`).
A restore's fingerprints are recomputed on the device and compared.
A checkpoint that is readable but does not fit the model is a hard error, never skipped.
"""

import base64
import collections
import json
import os
import re
import time

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from maelm_jax.checkpoints import abandoned_reads
from maelm_jax.checkpoints import integrity as checkpoint_integrity
from maelm_jax.checkpoints.manifest import (
    CHECKPOINT_DIRNAME,
    MANIFEST,
    absolute,
    first_line,
    is_array_data,
    list_files,
    problem_with,
    saved_record,
    sha256,
)
from maelm_jax.checkpoints.params import check_params_match, check_same_tokenizer
from maelm_jax.checkpoints.save_errors import CheckpointSaveError, NonFiniteStateError
from maelm_jax.config.run_config import ConfigError, RunConfig
from maelm_jax.data.tokenizer import Tokenizer
from maelm_jax.hardware import multihost
from maelm_jax.step.train_state import TrainState

_ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp"


class Checkpointer:
    """Saves and restores one run's checkpoints; all processes construct and call it."""

    def __init__(self, run: RunConfig, workdir, tokenizer: Tokenizer):
        self.directory = absolute(workdir) / CHECKPOINT_DIRNAME
        # Orbax finishes saves in the order they start; its commit callback takes the oldest.
        self._uncommitted: collections.deque[tuple[int, float, dict]] = collections.deque()
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=run.checkpoint.every_steps,
            max_to_keep=run.checkpoint.keep,
            keep_period=run.checkpoint.keep_every_steps or None,
            create=True,
            cleanup_tmp_directories=True,
            enable_async_checkpointing=True,
            async_options=ocp.AsyncOptions(post_finalization_callback=self._before_commit),
        )
        try:  # before Orbax's threads start, which would report it from the background
            if self.directory.exists() and not self.directory.is_dir():
                raise NotADirectoryError(f"{self.directory} is a file, not a directory")
            self.directory.mkdir(parents=True, exist_ok=True)
            self.manager = ocp.CheckpointManager(
                self.directory,
                options=options,
                item_handlers={
                    "state": ocp.StandardCheckpointHandler(),
                    "data": ocp.JsonCheckpointHandler(),
                    "config": ocp.JsonCheckpointHandler(),
                    "tokenizer": ocp.JsonCheckpointHandler(),
                },
            )
        except (OSError, ValueError) as e:  # not a directory, not writable, not listable
            raise CheckpointSaveError(
                f"cannot keep checkpoints in {self.directory}: {first_line(e)}"
            ) from e
        self._config_json = json.loads(run.source_json)
        self._tokenizer_json = {
            "sentencepiece_model_base64": base64.b64encode(tokenizer.serialized()).decode(),
            "fingerprint": tokenizer.fingerprint,
        }

    # --- Saving ---------------------------------------------------------------------------

    def _before_commit(self):
        """Orbax calls this once a step's files are all written, just before it commits the
        step (renames its temporary directory, or writes commit_success.txt on object
        stores). Writing the manifest here makes it part of the same atomic commit."""
        if not self._uncommitted:
            return
        step, started, arrays = self._uncommitted.popleft()
        if jax.process_index() != 0:
            return
        step_dir = self.directory / f"{step}{_ORBAX_TMP_SUFFIX}"
        if not step_dir.exists():  # object stores commit in place
            step_dir = self.directory / str(step)
        files = list_files(step_dir)
        digests = {n: sha256(step_dir / n) for n in files if not is_array_data(n)}
        manifest = {"step": step, "files": files, "sha256": digests, "arrays": arrays}
        (step_dir / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        logging.info(
            "Checkpoint %d written in %.1fs (%.1f MB)",
            step,
            time.perf_counter() - started,
            sum(manifest["files"].values()) / 1e6,
        )

    def check_for_errors(self) -> None:
        """Raises CheckpointSaveError as soon as a background save has failed.

        Orbax's own finalize thread takes a background error and only re-raises it from
        `wait_until_finished`, so once no save is in flight that call (which then does not
        block) is what surfaces it, instead of the next save, many steps later.
        """
        try:
            self.manager.check_for_errors()
            if not self.manager.is_saving_in_progress():
                self.manager.wait_until_finished()
        except Exception as e:
            raise CheckpointSaveError(f"saving a checkpoint in {self.directory} failed: {e}") from e

    def save(self, step: int, state: TrainState, data_state: dict, force: bool = False) -> bool:
        """Starts an async save of `state` at `step`; returns once the arrays are copied."""
        self.check_for_errors()
        if step in self.manager.all_steps():
            return False
        started = time.perf_counter()
        arrays, finite = checkpoint_integrity.record(state)
        if not finite:
            raise NonFiniteStateError(
                f"the state at step {step} has non-finite (NaN/inf) parameters or optimizer "
                f"state; it was not saved, so {self.directory} keeps its last good checkpoint"
            )
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state),
            config=ocp.args.JsonSave(self._config_json),
            tokenizer=ocp.args.JsonSave(self._tokenizer_json),
        )
        self._uncommitted.append((step, started, arrays))
        try:
            saved = self.manager.save(step, args=args, force=force)
        except Exception as e:
            raise CheckpointSaveError(f"saving checkpoint {step} failed: {e}") from e
        if not saved:
            self._uncommitted.pop()
        return saved

    def wait_until_finished(self) -> None:
        try:
            self.manager.wait_until_finished()
        except Exception as e:
            raise CheckpointSaveError(f"saving a checkpoint in {self.directory} failed: {e}") from e
        self.check_for_errors()

    def close(self) -> None:
        self.wait_until_finished()
        self.manager.close()

    # --- Restoring ------------------------------------------------------------------------

    def _quarantine(self, step: int, reason: str) -> epath.Path:
        """Renames step `step` aside (process 0); returns where it went."""
        tag = "".join(c if c.isalnum() else "-" for c in reason.split(":")[0])[:40]
        target = self.directory / f"{step}.unusable-{tag.strip('-')}"
        if jax.process_index() == 0:
            (self.directory / str(step)).rename(target)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(
                f"maelm_jax.checkpoints.checkpointing.quarantine.{step}"
            )
        return target

    def _verify(self, step_dir: epath.Path, state: TrainState) -> str | None:
        """Why the restored `state` is not what was saved, or None (collective)."""
        restored, finite = checkpoint_integrity.record(state)
        try:
            saved = saved_record(step_dir)
        except (OSError, ValueError) as e:
            return f"unreadable {MANIFEST} ({first_line(e)})"
        if saved is not None:
            mismatch = checkpoint_integrity.first_mismatch(saved, restored)
            if mismatch:
                return mismatch
        if not finite:
            return "the restored state holds non-finite (NaN/inf) values"
        return None

    def _check_tokenizer(self, saved: dict, where: str) -> None:
        check_same_tokenizer(saved, self._tokenizer_json["fingerprint"], where)

    def restore_latest(self, abstract_state: TrainState):
        """(state, data_state) from the newest trustworthy step, or None if there is none.

        `abstract_state` carries the target shardings, so a checkpoint written on another
        mesh, device count or process count is resharded while it is read.
        """
        steps = sorted(self.manager.all_steps(), reverse=True)
        skipped = []
        for step in steps:
            step_dir = self.directory / str(step)
            problem = problem_with(step_dir)
            saved_params = None
            if problem is None:
                try:
                    saved = self.manager.item_metadata(step)["state"]
                    saved_params = (saved.tree if hasattr(saved, "tree") else saved)["params"]
                except Exception as e:  # damaged metadata: bad bytes, bad JSON
                    problem = f"unreadable metadata: {first_line(e)}"
            if problem is None:
                check_params_match(saved_params, abstract_state.params, os.fspath(step_dir))
                restored = None
                try:
                    with abandoned_reads.ended_on_failure():
                        restored = self.manager.restore(
                            step,
                            args=ocp.args.Composite(
                                state=ocp.args.StandardRestore(abstract_state),
                                data=ocp.args.JsonRestore(),
                                tokenizer=ocp.args.JsonRestore(),
                            ),
                        )
                except Exception as e:  # a truncated or corrupted array file
                    problem = f"unreadable: {_read_error(e)}"
                if not multihost.all_true(restored is not None):
                    problem = problem or "unreadable on another process"
                else:  # collective, and the same answer on every process
                    problem = self._verify(step_dir, restored.state)
            if problem is None:
                self._check_tokenizer(restored.tokenizer, os.fspath(step_dir))
                for bad_step, reason in skipped:  # one line each: what, why, where, instead
                    logging.warning(
                        "Checkpoint %s is incomplete or corrupt (%s): moved it to %s and "
                        "restored %s instead",
                        self.directory / str(bad_step),
                        reason,
                        self._quarantine(bad_step, reason),
                        step_dir,
                    )
                if skipped:
                    self.manager.reload()
                else:
                    logging.info("Restored checkpoint %s (integrity record verified)", step_dir)
                return restored.state, restored.data
            skipped.append((step, problem))
        if skipped:
            reasons = "; ".join(f"step {s}: {r}" for s, r in skipped)
            raise ConfigError(
                f"no usable checkpoint in {self.directory} ({reasons}). Nothing was changed; "
                "move the directory away to start from step 0"
            )
        return None


def _read_error(e: BaseException) -> str:
    """The first line of the error TensorStore gave, under Orbax's wrapper (whose own
    message is the index read and the store's whole spec), without the store's path."""
    while e.__cause__ is not None:
        e = e.__cause__
    line = re.sub(r' in OCDBT database at local file "[^"]*"', "", (str(e).splitlines() or [""])[0])
    return f"{type(e).__name__}: {line[:200]}"
