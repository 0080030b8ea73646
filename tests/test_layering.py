"""The package's shape: imports point down the layers, nothing below what a user runs imports
the user's config files (configs/, which build on it), the ConfigDict stops at the commands, the
package's top holds only the commands, no room grows past what a reader can scan, and no two
folders of the repository share a name (a path names one place).

Read from the source (`ast`), not from `sys.modules`, so a lazy import inside a function
counts as much as one at the top of a file.
"""

import ast
import collections
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "maelm_jax"

# Bottom to top; a module may import its own layer and the ones below it. `config.cli` is
# the commands' shared plumbing; the others are `python -m maelm_jax.<name>` entry points.
COMMANDS = (
    "main", "compile", "flops", "bench", "export", "analysis", "prepare_data", "finetune",
    "study",
)  # fmt: skip
# Rooms whose modules sit at different layers, each module a room of its own (see
# maelm_jax/config/__init__.py): `config.run_config` under everything, `config.cli` on top.
SPLIT_ROOMS = ("config",)
LAYERS = (
    # what every layer takes; `rules` names the model's remat policies for the model to read
    ("config", "config.run_config", "config.paths", "config.rules"),
    ("hardware",),
    ("model", "data"),
    ("config.configdict", "config.defaults"),  # the ConfigDict read, checked and frozen
    ("step",),  # what a train step is made of: state, update, optimizer, mesh, programs
    ("checkpoints", "aot"),  # the state on disk; the step compiled for a TPU topology
    # a checkpoint read back; HF export; GLUE's and SQuAD's data, metrics and scoring
    ("inspection", "hf", "glue", "squad"),
    ("finetuning",),  # an export fine-tuned on either family: the search, the loop, the recipe
    ("training",),  # the loop, its trace window and `bench speed`
    ("profiling",),  # where the loop's step spends time: the kernel table times the loop's step
    ("studies",),  # the papers' comparison: pretrain, export, fine-tune, measure
    ("config.cli", "benchmarks", *COMMANDS),  # benchmarks: `python -m maelm_jax.benchmarks.<name>`
)
# Rooms of one layer that must not know each other: the network never reads text files,
# and the data pipeline never builds a model.
APART = (("model", "data"),)
# Where `ml_collections` (the user's config format) may be imported inside the package.
CONFIGDICT_READERS = {"config.configdict", "config.defaults", "studies", *COMMANDS}
# The user's config files build on the package (configs/base.py on config.defaults); only what
# a user runs, a command or a benchmark, may name one.
USER_CONFIGS = "configs"
USER_CONFIG_READERS = {"benchmarks", *COMMANDS}
MAX_LINES = 400
MAX_MODULES_PER_FOLDER = 12
# Folders that tools make in a checkout (git, the virtualenv, caches, build outputs, runs),
# not the project's own; `*.egg-info` too.
TOOLS_FOLDERS = {
    ".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist",
    "workdirs", ".whl",
}  # fmt: skip


def room(module: str) -> str:
    """'maelm_jax.training.train' -> 'training'; 'maelm_jax.main' -> 'main';
    'maelm_jax.config.cli' -> 'config.cli' (a split room)."""
    parts = module.split(".")
    return ".".join(parts[1:3]) if parts[1] in SPLIT_ROOMS else parts[1]


def layer(module: str) -> int:
    for index, rooms in enumerate(LAYERS):
        if room(module) in rooms:
            return index
    raise AssertionError(f"{module} is in no layer of LAYERS: add its room there")


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: pathlib.Path) -> set[str]:
    """Every module `path` imports, at any depth of the file; `from a import b` names a.b
    when that is a module of the package, else a."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                parts = candidate.split(".")
                is_module = PACKAGE.parent.joinpath(*parts).with_suffix(".py").exists()
                found.add(candidate if is_module else node.module)
    return found


def violations(edges: dict[str, set[str]]) -> list[str]:
    """What breaks the layering in {module: modules it imports} (the package's only)."""
    problems = []
    for source, targets in sorted(edges.items()):
        if source == "maelm_jax":
            continue
        if room(source) not in USER_CONFIG_READERS:
            for target in sorted(t for t in targets if t.split(".")[0] == USER_CONFIGS):
                problems.append(f"{source} imports {target}, the user's config files")
        for target in sorted(t for t in targets if t.startswith("maelm_jax.")):
            if layer(target) > layer(source):
                problems.append(f"{source} imports {target}, a layer above it")
            if room(target) in COMMANDS:
                problems.append(f"{source} imports command module {target}")
            pair = {room(source), room(target)}
            if any(pair == set(apart) for apart in APART):
                problems.append(
                    f"{source} imports {target}: {' and '.join(sorted(pair))} stay apart"
                )
        reads_configdict = "ml_collections" in {t.split(".")[0] for t in targets}
        if reads_configdict and room(source) not in CONFIGDICT_READERS:
            problems.append(f"{source} imports ml_collections below the commands")
    return problems


def package_edges() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_imports_point_down_the_layers_and_the_configdict_stops_at_the_commands():
    assert violations(package_edges()) == []


@pytest.mark.parametrize(
    "edge,problem",
    [
        (("maelm_jax.model.attention", "maelm_jax.step.sharding"), "a layer above it"),
        (("maelm_jax.data.tokenizer", "maelm_jax.config.configdict"), "a layer above it"),
        (("maelm_jax.config.run_config", "maelm_jax.config.configdict"), "a layer above it"),
        # the three that once ran uphill (issue 64)
        (("maelm_jax.config.rules", "maelm_jax.model.remat"), "a layer above it"),
        (("maelm_jax.config.configdict", "configs.base"), "the user's config files"),
        (("maelm_jax.training.train", "maelm_jax.profiling.summary"), "a layer above it"),
        (("maelm_jax.training.train", "maelm_jax.config.cli"), "a layer above it"),
        (("maelm_jax.checkpoints.checkpointing", "maelm_jax.training.train"), "a layer above it"),
        (("maelm_jax.step.programs", "maelm_jax.checkpoints.checkpointing"), "a layer above it"),
        (("maelm_jax.inspection.fill_in", "maelm_jax.training.train"), "a layer above it"),
        (("maelm_jax.aot.analyze", "maelm_jax.compile"), "imports command module"),
        (("maelm_jax.data.shard_writer", "maelm_jax.model.positions.segments"), "stay apart"),
        (("maelm_jax.training.train", "ml_collections"), "ml_collections below the commands"),
    ],
)
def test_the_check_catches_each_kind_of_violation(edge, problem):
    """The check itself: each rule, broken once on top of the real graph, is reported, and
    reported as that edge (not as some other problem the graph happens to have)."""
    edges = package_edges()
    source, target = edge
    assert target not in edges[source], "plant an import the package does not have"
    edges[source] = edges[source] | {target}
    reported = [p for p in violations(edges) if p.startswith(f"{source} imports ")]
    assert [p for p in reported if target in p and problem in p] != []


def test_every_module_is_in_a_layer_and_no_file_or_folder_is_too_big():
    too_long = {
        module_name(p): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert too_long == {}, f"files over {MAX_LINES} lines: split them by responsibility"
    for folder in [PACKAGE, *(p.parent for p in PACKAGE.rglob("*/__init__.py"))]:
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        if folder != PACKAGE:  # the top is the list of commands, read by name
            assert len(modules) <= MAX_MODULES_PER_FOLDER, f"{folder.name}/ has {len(modules)}"
        for p in modules:
            layer(module_name(p))


def test_the_top_holds_only_the_commands():
    """A reader of maelm_jax/ sees what can be run and nothing else: every other module
    lives in a room (config/ holds the commands' shared plumbing)."""
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert sorted(top - set(COMMANDS)) == [], "move it into a room: the top is for commands"
    assert sorted(set(COMMANDS) - top) == [], "COMMANDS names a module that is not there"
    for name in COMMANDS:
        assert '__name__ == "__main__"' in (PACKAGE / f"{name}.py").read_text(), name


def project_folders(root: pathlib.Path) -> list[pathlib.Path]:
    """Every folder under `root` but the tools' (TOOLS_FOLDERS, `*.egg-info`)."""
    found = []
    for here, names, _ in os.walk(root):
        names[:] = sorted(
            n for n in names if n not in TOOLS_FOLDERS and not n.endswith(".egg-info")
        )
        found += [pathlib.Path(here, n) for n in names]
    return found


def shared_names(folders: list[pathlib.Path]) -> dict[str, list[str]]:
    """{name: its folders} for every folder name that more than one folder has."""
    by_name = collections.defaultdict(list)
    for folder in folders:
        by_name[folder.name].append(str(folder))
    return {name: paths for name, paths in sorted(by_name.items()) if len(paths) > 1}


def test_no_two_folders_share_a_name():
    """`kernels/` once meant both the attention kernels and a profile's kernel table: a
    folder's name alone says which place it is."""
    folders = [p.relative_to(REPO) for p in project_folders(REPO)]
    assert shared_names(folders) == {}
    planted = [*folders, pathlib.Path("maelm_jax/step/model")]
    assert shared_names(planted) == {"model": ["maelm_jax/model", "maelm_jax/step/model"]}


def test_the_suites_longest_first_order_names_modules_that_exist():
    """conftest.HEAVIEST_FIRST hands the long modules out first; a renamed module would
    silently fall back to file order and put a long module back at the end of the suite."""
    from conftest import HEAVIEST_FIRST

    missing = [name for name in HEAVIEST_FIRST if not (REPO / "tests" / name).is_file()]
    assert not missing, f"conftest.HEAVIEST_FIRST names no module {missing}; rename them there"
    assert len(set(HEAVIEST_FIRST)) == len(HEAVIEST_FIRST)


def test_the_slow_set_names_modules_and_tests_that_exist():
    """conftest's slow set leaves the README's command by name: a renamed module or test
    would silently move back into the fast set, and the command's time with it."""
    from conftest import SLOW_MODULES, SLOW_TESTS

    tests = REPO / "tests"
    missing = [name for name in SLOW_MODULES if not (tests / name).is_file()]
    for entry in SLOW_TESTS:
        module, _, name = entry.partition("::")
        path = tests / module
        if not path.is_file() or f"def {name}(" not in path.read_text():
            missing.append(entry)
    assert not missing, f"conftest's slow set names nothing at {missing}; rename them there"
