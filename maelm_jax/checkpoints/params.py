"""Another run's weights: whether a checkpoint fits this model and tokenizer, and reading
only its parameters (`init_from`)."""

import os

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from maelm_jax.checkpoints.manifest import CHECKPOINT_DIRNAME, absolute, problem_with
from maelm_jax.config.run_config import ConfigError


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
