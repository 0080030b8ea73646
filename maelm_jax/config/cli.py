"""How a command (`main`, `compile`, `bench`) starts and ends: bad input is one line.

`run(main)` parses the absl flags itself, so an unknown config key, a typo in a nested key,
a missing config file, a file without `get_config` or a value of the wrong type becomes
`<prog>: error: ...` naming the flag and what is allowed, with exit status 2, instead of
ml_collections' traceback. An error `main` raises that the user can act on (ConfigError and
the command's own `errors`) becomes the same one line with `error_status`.

Every error exit flushes the logs and ends the process with `os._exit`: background threads
that are not daemons (Orbax's and TensorStore's writers) would otherwise keep a failed run
alive after its last line, and a hung host of a pod is worse than a dead one. Imports stay
light here so that bad flags are answered before jax or TensorFlow load.
"""

import contextlib
import importlib.util
import logging as python_logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from absl import app, flags, logging

from maelm_jax.config.run_config import ConfigError

EXIT_USAGE = 2
CONFIG_FLAG = "config"


class _QuietLibraries(python_logging.Filter):
    """Orbax narrates every save at INFO; keep its warnings and errors, drop the rest."""

    def filter(self, record: python_logging.LogRecord) -> bool:
        return record.levelno >= python_logging.WARNING or "/orbax/" not in record.pathname


def quiet_library_logs() -> None:
    """Installs the filter on absl's handler (call from an absl `main`)."""
    logging.get_absl_handler().addFilter(_QuietLibraries())


def exit_now(status: int, message: str | None = None, prog: str = "maelm_jax") -> NoReturn:
    """Flushes logs and output, prints `prog: error: message` last, and ends the process
    whatever threads are still running."""
    with contextlib.suppress(Exception):  # exiting anyway
        logging.flush()
    sys.stdout.flush()
    if message is not None:
        sys.stderr.write(f"{prog}: error: {' '.join(str(message).split())}\n")
    sys.stderr.flush()
    os._exit(status)


def _config_path(argv: list[str]) -> str | None:
    for arg in reversed(argv):
        if arg.startswith(f"--{CONFIG_FLAG}="):
            return arg.split("=", 1)[1]
    return None


def load_config_file(path: str, flag: str = CONFIG_FLAG):
    """The ConfigDict of config file `path`, given as `--flag`; ConfigError when there is none
    to load."""
    if not os.path.isfile(path):
        what = "a directory" if os.path.isdir(path) else "no such file"
        raise ConfigError(
            f"--{flag}={path}: {what}; give a Python file defining get_config(), "
            "e.g. configs/default.py"
        )
    spec = importlib.util.spec_from_file_location("maelm_jax_config_file", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise ConfigError(
            f"--{flag}={path}: the file fails to load ({type(e).__name__}: {e})"
        ) from None
    if not callable(getattr(module, "get_config", None)):
        raise ConfigError(
            f"--{flag}={path} defines no get_config(); a config file is a Python "
            "module whose get_config() returns an ml_collections.ConfigDict"
        )
    return module.get_config()


def _override_problem(config, argv: list[str]) -> str | None:
    """The first `--config.a.b=value` naming a key `config` lacks, with the keys allowed."""
    for arg in argv:
        if not arg.startswith(f"--{CONFIG_FLAG}."):
            continue
        name = arg[len(f"--{CONFIG_FLAG}.") :].split("=", 1)[0]
        node, walked = config, []
        for key in name.split("."):
            keys = list(node.keys()) if hasattr(node, "keys") else []
            if key not in keys:
                where = f"{CONFIG_FLAG}.{'.'.join(walked)}" if walked else "the config"
                return f"{arg}: {where} has no key {key!r}; allowed keys: {', '.join(keys)}"
            node, walked = node[key], [*walked, key]
    return None


def _wrong_type(config, error: flags.Error) -> str:
    """A flag error, with the type the config expects when it is a config override."""
    text = str(error)
    if config is None or not text.startswith(f"flag --{CONFIG_FLAG}."):
        return text
    name = text[len(f"flag --{CONFIG_FLAG}.") :].split("=", 1)[0]
    node = config
    for key in name.split("."):
        node = node[key]
    return f"{text}; {CONFIG_FLAG}.{name} takes a {type(node).__name__} (now {node!r})"


def parse_flags(argv: list[str], prog: str = "maelm_jax") -> list[str]:
    """absl's flag parsing, with every failure one line and exit status 2."""
    config, path = None, _config_path(argv)
    try:
        if path is not None and CONFIG_FLAG in flags.FLAGS:
            config = load_config_file(path)
            problem = _override_problem(config, argv)
            if problem:
                raise ConfigError(problem)
        rest = flags.FLAGS(argv)
        if CONFIG_FLAG in flags.FLAGS:
            _ = flags.FLAGS[CONFIG_FLAG].value  # loads it now, inside this handler
    except ConfigError as e:
        exit_now(EXIT_USAGE, str(e), prog)
    except flags.Error as e:
        exit_now(EXIT_USAGE, f"{_wrong_type(config, e)} (see --helpfull)", prog)
    except Exception as e:  # ml_collections' own errors: unknown keys, bad files
        exit_now(EXIT_USAGE, f"bad flags ({type(e).__name__}: {e})", prog)
    return rest


def run(
    main: Callable[[list[str]], int | None],
    *,
    errors: tuple[type[BaseException], ...] = (),
    error_status: int = 1,
    prog: str = "maelm_jax",
) -> NoReturn:
    """`app.run(main)` with one-line errors and a prompt exit on every error path."""

    def guarded(argv):
        try:
            status = main(argv)
        except app.UsageError as e:
            exit_now(EXIT_USAGE, str(e), prog)
        except (ConfigError, *errors) as e:
            exit_now(error_status, str(e), prog)
        except SystemExit as e:
            if e.code in (None, 0):
                raise
            if isinstance(e.code, int):
                exit_now(e.code, None, prog)
            exit_now(1, str(e.code).removeprefix(f"{prog}: error: "), prog)
        except KeyboardInterrupt:
            exit_now(130, "interrupted", prog)
        except BaseException:  # a bug: its traceback is what a maintainer needs
            traceback.print_exc()
            exit_now(1)
        if status:
            exit_now(int(status))

    app.run(guarded, flags_parser=lambda argv: parse_flags(argv, prog))
    raise AssertionError("app.run returned")
