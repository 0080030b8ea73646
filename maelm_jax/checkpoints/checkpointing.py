"""Orbax checkpoints in `WORKDIR/checkpoints/<step>/` that a preempted pod job can trust.

A checkpoint holds the train state (params, optimizer state, step), the data-pipeline
position, the config (JSON) and the tokenizer model, so a run can be resumed or exported
from the checkpoint alone. Saves are asynchronous and every process takes part.

Trust comes from a manifest: when all of a step's files are written and before Orbax
commits the step, process 0 adds `maelm_manifest.json` listing every file and its size, the
sha256 of every file that is not array data (metadata, JSON items), and the integrity record
of the arrays (`checkpoint_integrity`: fingerprints taken on the device before the write). A
step without it, with a file missing, resized or changed, whose metadata or arrays fail to
read, whose restored arrays do not match their fingerprints, or whose state is not finite,
is reported and the previous good step is used instead; once one is found, the bad ones are
renamed to `<step>.unusable-<reason>` (never deleted) so the resumed run can write those
steps again. A restore's fingerprints are recomputed on the device and compared.
A checkpoint that is readable but does not fit the model is a hard error, never skipped.
"""

import base64
import collections
import hashlib
import json
import logging as logging_lib
import os
import sys
import time
import traceback

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from maelm_jax import paths
from maelm_jax.checkpoints import integrity as checkpoint_integrity
from maelm_jax.configuration import ConfigError
from maelm_jax.data.tokenizer import Tokenizer
from maelm_jax.hardware import multihost
from maelm_jax.training.train_state import TrainState

CHECKPOINT_DIRNAME = "checkpoints"
MANIFEST = "maelm_manifest.json"
ORBAX_COMMIT = "commit_success.txt"
_ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp"
# Orbax rewrites these while committing, after the manifest is taken.
_UNLISTED = {MANIFEST, ORBAX_COMMIT, "_CHECKPOINT_METADATA"}


class CheckpointSaveError(RuntimeError):
    """An asynchronous save failed; the run must stop rather than go on unprotected."""


class NonFiniteStateError(CheckpointSaveError):
    """The state due for a checkpoint holds NaN/inf: saving it would poison every rerun."""


def _is_echo_of_failed_write(exc: BaseException | None, tb) -> bool:
    return (
        isinstance(exc, RuntimeError)
        and str(exc) == "Event loop is closed"
        and any(frame.name == "call_soon_threadsafe" for frame in traceback.extract_tb(tb))
    )


class _DropUnretrievedOrbaxErrors(logging_lib.Filter):
    def filter(self, record: logging_lib.LogRecord) -> bool:
        if "exception was never retrieved" not in record.getMessage() or not record.exc_info:
            return True
        frames = traceback.extract_tb(record.exc_info[2])
        return not any("/orbax/checkpoint/" in frame.filename for frame in frames)


def silence_writes_after_a_failed_save() -> None:
    """Keeps a failed save's echoes off stderr (call from `main`).

    When one of a save's writes fails (a full disk, say), Orbax stops awaiting the others:
    asyncio then logs each of their failures as "... exception was never retrieved", and
    TensorStore, finishing writes for an event loop Orbax has closed, reports each failed
    `loop.call_soon_threadsafe` through `sys.unraisablehook`. That is hundreds of
    tracebacks, printed from other threads, which bury and can split the one line saying
    what went wrong. The failure itself still reaches the main thread through
    `Checkpointer.check_for_errors`, and Orbax logs its first error; only the echoes go.
    """
    logging_lib.getLogger("asyncio").addFilter(_DropUnretrievedOrbaxErrors())
    previous = sys.unraisablehook

    def hook(unraisable):
        if not _is_echo_of_failed_write(unraisable.exc_value, unraisable.exc_traceback):
            previous(unraisable)

    sys.unraisablehook = hook


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def check_same_tokenizer(saved: dict, fingerprint: str, where: str) -> None:
    """ConfigError when checkpoint `where` was trained with another tokenizer than this run's:
    same-size vocabularies fit the model, so nothing else would notice the ids mean other
    pieces."""
    saved_fingerprint = saved.get("fingerprint")
    if saved_fingerprint != fingerprint:
        raise ConfigError(
            f"checkpoint {where} was trained with tokenizer sha256 {saved_fingerprint} but this "
            f"run's tokenizer (vocab_path or WORKDIR/tokenizer.model) is sha256 {fingerprint}; "
            "use the tokenizer the checkpoint was trained with (its checkpoint holds it)"
        )


def _keystr(path) -> str:
    parts = []
    for key in path:
        parts.append(str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key)))))
    return "/".join(parts)


def _shapes_by_path(tree) -> dict[str, tuple]:
    leaves = jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))
    return {_keystr(path): tuple(leaf.shape) for path, leaf in leaves}


def check_params_match(saved_params, model_params, where: str) -> None:
    """ConfigError naming the first parameter whose presence or shape differs."""
    saved, wanted = _shapes_by_path(saved_params), _shapes_by_path(model_params)
    for path in sorted(set(saved) | set(wanted)):
        if path not in saved:
            raise ConfigError(
                f"checkpoint {where} has no parameter {path!r}; the model wants shape "
                f"{wanted[path]}: the checkpoint was written by a different architecture"
            )
        if path not in wanted:
            raise ConfigError(
                f"checkpoint {where} has parameter {path!r} with shape {saved[path]} that the "
                "model does not have: the checkpoint was written by a different architecture"
            )
        if saved[path] != wanted[path]:
            raise ConfigError(
                f"checkpoint {where}: parameter {path!r} has shape {saved[path]} in the "
                f"checkpoint but {wanted[path]} in the model (check num_layers, hidden_size, "
                "vocab and scan_layers)"
            )


def absolute(path) -> epath.Path:
    """Orbax wants absolute paths; a relative local workdir is taken from the current dir."""
    path = paths.path(path)  # file:// URLs too
    return path if "://" in os.fspath(path) else epath.Path(os.path.abspath(os.fspath(path)))


def _list_files(step_dir: epath.Path) -> dict[str, int]:
    """{relative path: size} of the files below `step_dir` that stay fixed once written."""
    files = {}
    pending = [step_dir]
    while pending:
        for path in pending.pop().iterdir():
            if path.is_dir():
                pending.append(path)
            elif path.name not in _UNLISTED:
                files[os.fspath(path.relative_to(step_dir))] = path.stat().length
    return files


def _is_array_data(name: str) -> bool:
    """OCDBT's data files (`.../d/<hash>`): their integrity is the arrays' fingerprints."""
    return "d" in name.split(os.sep)[:-1]


def _sha256(path: epath.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def problem_with(step_dir: epath.Path) -> str | None:
    """Why a committed-looking step cannot be trusted, or None if its files are all there."""
    if not (step_dir / ORBAX_COMMIT).exists():
        return f"no {ORBAX_COMMIT}: the save never finished"
    orbax_metadata = step_dir / "_CHECKPOINT_METADATA"  # rewritten at commit: not listed
    if orbax_metadata.exists():
        try:
            json.loads(orbax_metadata.read_text())
        except ValueError as e:  # UnicodeDecodeError included
            return f"unreadable _CHECKPOINT_METADATA ({_first_line(e)})"
    manifest = step_dir / MANIFEST
    if not manifest.exists():
        return f"no {MANIFEST}: the save was not confirmed complete"
    try:
        record = json.loads(manifest.read_text())
        expected, digests = record["files"], record.get("sha256", {})
    except (ValueError, KeyError, TypeError) as e:
        return f"unreadable {MANIFEST} ({type(e).__name__}: {e})"
    present = _list_files(step_dir)
    for name, size in sorted(expected.items()):
        if name not in present:
            return f"file {name} is missing"
        if present[name] != size:
            return f"file {name} has {present[name]} bytes, {size} were written"
    for name, digest in sorted(digests.items()):
        if _sha256(step_dir / name) != digest:
            return f"file {name} was changed after it was written (sha256 differs)"
    return None


def _saved_record(step_dir: epath.Path) -> dict[str, list[int]] | None:
    """The arrays' integrity record in the manifest (None: written before records)."""
    return json.loads((step_dir / MANIFEST).read_text()).get("arrays")


class Checkpointer:
    """Saves and restores one run's checkpoints; all processes construct and call it."""

    def __init__(self, config: ml_collections.ConfigDict, workdir, tokenizer: Tokenizer):
        self.directory = absolute(workdir) / CHECKPOINT_DIRNAME
        # Orbax finishes saves in the order they start; its commit callback takes the oldest.
        self._uncommitted: collections.deque[tuple[int, float, dict]] = collections.deque()
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=config.checkpoint_every_steps,
            max_to_keep=config.keep_checkpoints,
            keep_period=config.keep_every_steps or None,
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
                f"cannot keep checkpoints in {self.directory}: {_first_line(e)}"
            ) from e
        self._config_json = json.loads(config.to_json_best_effort())
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
        files = _list_files(step_dir)
        digests = {n: _sha256(step_dir / n) for n in files if not _is_array_data(n)}
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

    def _quarantine(self, step: int, reason: str) -> None:
        if jax.process_index() == 0:
            tag = "".join(c if c.isalnum() else "-" for c in reason.split(":")[0])[:40]
            target = self.directory / f"{step}.unusable-{tag.strip('-')}"
            (self.directory / str(step)).rename(target)
            logging.warning("Moved checkpoint %d aside to %s", step, target)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(
                f"maelm_jax.checkpoints.checkpointing.quarantine.{step}"
            )

    def _verify(self, step_dir: epath.Path, state: TrainState) -> str | None:
        """Why the restored `state` is not what was saved, or None (collective)."""
        restored, finite = checkpoint_integrity.record(state)
        try:
            saved = _saved_record(step_dir)
        except (OSError, ValueError) as e:
            return f"unreadable {MANIFEST} ({_first_line(e)})"
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
                    problem = f"unreadable metadata: {_first_line(e)}"
            if problem is None:
                check_params_match(saved_params, abstract_state.params, os.fspath(step_dir))
                restored = None
                try:
                    restored = self.manager.restore(
                        step,
                        args=ocp.args.Composite(
                            state=ocp.args.StandardRestore(abstract_state),
                            data=ocp.args.JsonRestore(),
                            tokenizer=ocp.args.JsonRestore(),
                        ),
                    )
                except Exception as e:  # a truncated or corrupted array file
                    problem = f"unreadable: {_first_line(e)}"
                if not multihost.all_true(restored is not None):
                    problem = problem or "unreadable on another process"
                else:  # collective, and the same answer on every process
                    problem = self._verify(step_dir, restored.state)
            if problem is None:
                self._check_tokenizer(restored.tokenizer, os.fspath(step_dir))
                for bad_step, reason in skipped:
                    self._quarantine(bad_step, reason)
                if skipped:
                    self.manager.reload()
                logging.info("Restored checkpoint %s (integrity record verified)", step_dir)
                return restored.state, restored.data
            logging.warning(
                "Checkpoint %s is incomplete or corrupt (%s); trying the previous one",
                step_dir,
                problem,
            )
            skipped.append((step, problem))
        if skipped:
            reasons = "; ".join(f"step {s}: {r}" for s, r in skipped)
            raise ConfigError(
                f"no usable checkpoint in {self.directory} ({reasons}). Nothing was changed; "
                "move the directory away to start from step 0"
            )
        return None


def _resolve_init_from(path: epath.Path) -> epath.Path:
    """A step directory, or the newest trustworthy step of a checkpoints dir or workdir."""
    if (path / "state").exists():
        return path
    root = path / CHECKPOINT_DIRNAME if (path / CHECKPOINT_DIRNAME).exists() else path
    steps = sorted((int(p.name) for p in root.glob("*") if p.name.isdigit()), reverse=True)
    for step in steps:
        if problem_with(root / str(step)) is None:
            return root / str(step)
    raise ConfigError(
        f"init_from={os.fspath(path)!r} holds no usable checkpoint; give a step directory "
        "(.../checkpoints/<step>), a checkpoints directory or a workdir"
    )


def load_params(init_from: str, abstract_params, tokenizer_fingerprint: str | None = None):
    """Only the parameters of another run's checkpoint, placed in `abstract_params`'s
    shardings; the optimizer state and step of that run are not read. With
    `tokenizer_fingerprint`, that run must have used the same tokenizer."""
    path = absolute(init_from)
    if not path.exists():
        raise ConfigError(f"init_from={init_from!r} does not exist")
    step_dir = _resolve_init_from(path)
    if tokenizer_fingerprint is not None:
        saved = ocp.JsonCheckpointHandler().restore(step_dir / "tokenizer")
        check_same_tokenizer(saved, tokenizer_fingerprint, os.fspath(step_dir))
    handler = ocp.StandardCheckpointHandler()
    saved = handler.metadata(step_dir / "state")
    saved_tree = saved.tree if hasattr(saved, "tree") else saved
    check_params_match(saved_tree["params"], abstract_params, os.fspath(step_dir))
    target = {"params": abstract_params}
    restored = ocp.PyTreeCheckpointer().restore(
        step_dir / "state",
        args=ocp.args.PyTreeRestore(
            item=target,
            restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True,
        ),
    )
    logging.info("Initialised parameters from %s", step_dir)
    return restored["params"]
