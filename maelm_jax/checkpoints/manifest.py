"""What makes a checkpoint step trustworthy on disk: the manifest process 0 writes before
Orbax commits a step, and the check of a step's files against it (`problem_with`).

The manifest lists every file and its size, the sha256 of every file that is not array
data (metadata, JSON items), and the arrays' integrity record (`integrity`: fingerprints
taken on the device before the write).
"""

import hashlib
import json
import os

from etils import epath

from maelm_jax.config import paths

CHECKPOINT_DIRNAME = "checkpoints"
MANIFEST = "maelm_manifest.json"
ORBAX_COMMIT = "commit_success.txt"
# Orbax rewrites these while committing, after the manifest is taken.
_UNLISTED = {MANIFEST, ORBAX_COMMIT, "_CHECKPOINT_METADATA"}


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def absolute(path) -> epath.Path:
    """Orbax wants absolute paths; a relative local workdir is taken from the current dir."""
    path = paths.path(path)  # file:// URLs too
    return path if "://" in os.fspath(path) else epath.Path(os.path.abspath(os.fspath(path)))


def list_files(step_dir: epath.Path) -> dict[str, int]:
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


def is_array_data(name: str) -> bool:
    """OCDBT's data files (`.../d/<hash>`): their integrity is the arrays' fingerprints."""
    return "d" in name.split(os.sep)[:-1]


def sha256(path: epath.Path) -> str:
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
            return f"unreadable _CHECKPOINT_METADATA ({first_line(e)})"
    manifest = step_dir / MANIFEST
    if not manifest.exists():
        return f"no {MANIFEST}: the save was not confirmed complete"
    try:
        record = json.loads(manifest.read_text())
        expected, digests = record["files"], record.get("sha256", {})
    except (ValueError, KeyError, TypeError) as e:
        return f"unreadable {MANIFEST} ({type(e).__name__}: {e})"
    present = list_files(step_dir)
    for name, size in sorted(expected.items()):
        if name not in present:
            return f"file {name} is missing"
        if present[name] != size:
            return f"file {name} has {present[name]} bytes, {size} were written"
    for name, digest in sorted(digests.items()):
        if sha256(step_dir / name) != digest:
            return f"file {name} was changed after it was written (sha256 differs)"
    return None


def saved_record(step_dir: epath.Path) -> dict[str, list[int]] | None:
    """The arrays' integrity record in the manifest (None: written before records)."""
    return json.loads((step_dir / MANIFEST).read_text()).get("arrays")
