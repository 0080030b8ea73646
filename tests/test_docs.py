"""The manual stays true to the code: README.md and docs/*.md name only real commands, flags,
config keys, config files and pages.

What is checked, in every Markdown file:
- `python -m maelm_jax.<name>` names a command module (a file of the package with a
  `__main__` block), and `python -m maelm_jax.benchmarks.<name>` a benchmark with one; a
  command with verbs (`bench speed`) is given one of them;
- every `--flag` on that command's logical line (a code block's line with its backslash
  continuations, or one inline code span, which may wrap) is one of the command's flags;
- every `--config.<key>[.<key>]`, anywhere, is a key of `configs/base.py`'s `get_config()`;
- every `configs/<name>.py` (brace lists expanded) and every `--configs=` name exists;
- every relative link `[text](path)` resolves from the file that holds it.

A command's flags come from its source, read with `ast`, not from importing it: importing
all seven commands into one process collides in absl's global flag registry, `compile`,
`export`, `analysis` and `prepare_data` define theirs only when run as `__main__` (inside a
function that an import never calls), and seven subprocesses that import jax would cost most
of this test's time budget. The `ast` walk finds every `flags.DEFINE_*(name, ...)` and
`config_flags.DEFINE_config_file(name, ...)` call anywhere in the module, which is exactly
what `__main__` can define; `test_only_commands_define_flags` holds the one assumption that
makes that complete (no other package module defines a flag). absl's own flags (`--helpfull`)
are always allowed, and a command that calls `jax.config.config_with_absl()` also takes
jax's `--jax_*` flags. A benchmark that hands its flags to a command
(`runpy.run_module("maelm_jax.bench")`) takes that command's.
"""

import ast
import fnmatch
import functools
import importlib
import itertools
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "maelm_jax"
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

# absl.app's and absl.logging's flags, which every command accepts.
ABSL_FLAGS = frozenset(
    {
        "help", "helpfull", "helpshort", "helpxml", "flagfile", "undefok", "only_check_args",
        "pdb", "pdb_post_mortem", "run_with_pdb", "run_with_profiling", "profile_file",
        "use_cprofile_for_profiling", "logtostderr", "alsologtostderr", "log_dir",
        "verbosity", "v", "stderrthreshold", "showprefixforinfo", "logger_levels",
    }
)  # fmt: skip
COMMAND = re.compile(r"python3? -m maelm_jax\.(\w+(?:\.\w+)*)")
# A shell command ends at these; `|` only with spaces around it (`splash|xla` is one value).
COMMAND_END = re.compile(r"`|&&|;| \| | #|\bpython3? -m ")
CONFIG_FLAG = re.compile(r"--config\.([\w.]+)")
CONFIG_FILE = re.compile(r"configs/([\w{},*]+)\.py")
CONFIGS_LIST = re.compile(r"--configs[= ]([\w,/.]+)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`]+)`")


def is_verb_table(node: ast.AST, functions: set[str]) -> bool:
    """A dict literal from strings to the module's own functions, as `bench.main`'s
    {"speed": run_speed, ...}: its keys are the command's verbs."""
    return (
        isinstance(node, ast.Dict)
        and bool(node.keys)
        and all(
            isinstance(k, ast.Constant) and isinstance(v, ast.Name) and v.id in functions
            for k, v in zip(node.keys, node.values, strict=True)
        )
    )


def runs_command(node: ast.AST) -> str | None:
    """'bench' for a `runpy.run_module("maelm_jax.bench", ...)` call, else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    if node.func.attr != "run_module" or not node.args:
        return None
    target = node.args[0]
    if isinstance(target, ast.Constant) and str(target.value).startswith("maelm_jax."):
        return target.value.removeprefix("maelm_jax.")
    return None


@functools.cache
def commands() -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """{command: (its flag names, its verbs)} for every `python -m maelm_jax.<command>`,
    the benchmarks' as `benchmarks.<name>`."""
    found = {}
    for path in [*sorted(PACKAGE.glob("*.py")), *sorted((PACKAGE / "benchmarks").glob("*.py"))]:
        tree = ast.parse(path.read_text(), str(path))
        if '__name__ == "__main__"' not in path.read_text():
            continue
        names, verbs, takes_jax_flags = set(), set(), False
        defined_functions = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        for node in ast.walk(tree):
            if (command := runs_command(node)) in found:
                names |= found[command][0]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "config_with_absl":
                    takes_jax_flags = True
                if node.func.attr.startswith("DEFINE"):
                    name = node.args[0] if node.args else None
                    name = name or next((k.value for k in node.keywords if k.arg == "name"), None)
                    if isinstance(name, ast.Constant) and isinstance(name.value, str):
                        names.add(name.value)
            if is_verb_table(node, defined_functions):
                verbs |= {k.value for k in node.keys}
        if takes_jax_flags:
            names.add("jax_*")
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        found[module] = (frozenset(names | ABSL_FLAGS), frozenset(verbs))
    return found


@functools.cache
def config_keys() -> frozenset[str]:
    """Every dotted key of configs/base.py's get_config(), nested ConfigDicts included."""
    import ml_collections

    from configs import base

    keys = set()

    def walk(config, prefix):
        for key, value in config.items():
            keys.add(prefix + key)
            if isinstance(value, ml_collections.ConfigDict):
                walk(value, prefix + key + ".")

    walk(base.get_config(), "")
    return frozenset(keys)


def logical_lines(text: str) -> list[str]:
    """Each code block's lines (backslash continuations joined) and each inline code span
    (newlines inside it made spaces): the places a command is written."""
    lines = []
    for block in FENCE.findall(text):
        lines += block.replace("\\\n", " ").splitlines()[1:-1]
    prose = FENCE.sub("\n", text)
    lines += [span.replace("\n", " ") for span in CODE_SPAN.findall(prose)]
    return lines


def expand_braces(name: str) -> list[str]:
    """'modern_{mlm,mae_lm}_base' -> ['modern_mlm_base', 'modern_mae_lm_base']."""
    parts = re.split(r"\{([^}]*)\}", name)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def command_problems(line: str) -> list[str]:
    problems = []
    for match in COMMAND.finditer(line):
        name = match.group(1)
        if name not in commands():
            problems.append(f"`python -m maelm_jax.{name}`: no such command")
            continue
        flag_names, verbs = commands()[name]
        rest = line[match.end() :]
        end = COMMAND_END.search(rest)
        tokens = [t.strip("[]'\"") for t in (rest[: end.start()] if end else rest).split()]
        if verbs and tokens and not tokens[0].startswith("-") and tokens[0] not in verbs:
            problems.append(f"maelm_jax.{name} {tokens[0]}: not one of {sorted(verbs)}")
        for token in tokens:
            if not token.startswith("--") or token.startswith("--config."):
                continue
            flag = token[2:].split("=")[0]
            if flag not in flag_names and not ("jax_*" in flag_names and flag.startswith("jax_")):
                problems.append(f"maelm_jax.{name} has no flag --{flag}")
    return problems


def problems_in(text: str, where: pathlib.Path) -> list[str]:
    """What in `text`, the content of file `where`, names something that does not exist."""
    problems = []
    for line in logical_lines(text):
        problems += command_problems(line)
    for match in COMMAND.finditer(FENCE.sub("\n", CODE_SPAN.sub(" ", text))):
        if match.group(1) not in commands():
            problems.append(f"`python -m maelm_jax.{match.group(1)}`: no such command")
    for key in sorted(set(CONFIG_FLAG.findall(text))):
        key = key.rstrip(".")
        if key not in config_keys():
            problems.append(f"--config.{key}: not a key of configs/base.py's get_config()")
    names = {n for m in CONFIG_FILE.findall(text) if "*" not in m for n in expand_braces(m)}
    listed = {n.rstrip(".") for m in CONFIGS_LIST.findall(text) for n in m.split(",")} - {""}
    names |= {n for n in listed if not n.endswith(".py")}  # bench's names
    for path in sorted(n for n in listed if n.endswith(".py")):  # study's files
        if not (ROOT / path).is_file():
            problems.append(f"--configs {path}: no such file")
    for name in sorted(names):
        if not (ROOT / "configs" / f"{name}.py").is_file():
            problems.append(f"configs/{name}.py: no such file")
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (where.parent / target.split("#")[0]).exists():
            problems.append(f"[...]({target}): no such file from {where.relative_to(ROOT)}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_flag_key_path_and_link_exists(page):
    assert problems_in(page.read_text(), page) == []


@pytest.mark.parametrize(
    "text, reported",
    [
        ("`python -m maelm_jax.bench speed --fly=1`", "maelm_jax.bench has no flag --fly"),
        ("```\npython -m maelm_jax.main --config=configs/default.py \\\n  --wrkdir x\n```",
         "maelm_jax.main has no flag --wrkdir"),
        ("`python -m maelm_jax.bench fly`", "maelm_jax.bench fly: not one of"),
        ("`python -m maelm_jax.train --config=c`", "maelm_jax.train`: no such command"),
        ("see python -m maelm_jax.nope for more", "maelm_jax.nope`: no such command"),
        ("`python -m maelm_jax.benchmarks.nope OUT`", "maelm_jax.benchmarks.nope`: no such"),
        ("`python -m maelm_jax.benchmarks.kernel_table --fly=1`",
         "maelm_jax.benchmarks.kernel_table has no flag --fly"),
        ("`--config.model.no_such_key=1`", "--config.model.no_such_key: not a key"),
        ("`--config.no_such_key=1`", "--config.no_such_key: not a key"),
        ("run `configs/nope.py` first", "configs/nope.py: no such file"),
        ("`configs/modern_{mlm,nope}_base.py`", "configs/modern_nope_base.py: no such file"),
        ("`bench speed --configs=mlm_base,nope`", "configs/nope.py: no such file"),
        ("[x](docs/nope.md)", "[...](docs/nope.md): no such file from README.md"),
        ("[x](docs/nope.md#part)", "[...](docs/nope.md#part): no such file from README.md"),
    ],
)  # fmt: skip
def test_a_planted_mistake_is_reported(text, reported):
    problems = problems_in(text, ROOT / "README.md")
    assert any(reported in p for p in problems), problems


def test_good_text_reports_nothing():
    text = (
        "```\npython -m maelm_jax.compile --config=configs/mae_lm_large.py \\\n"
        "  --topology=v5p-64 --json --helpfull --jax_platforms=cpu\n```\n"
        "`python -m maelm_jax.bench kernels --configs=mlm_base --steps=3`, "
        "`python -m maelm_jax.benchmarks.kernel_table --configs=mlm_base --steps=3`, "
        "`python3 -m maelm_jax.benchmarks.jax_speed OUT mlm=mlm_base@64x512`, "
        "`--config.mesh.ici.data=-1`, `configs/modern_{mlm,mae_lm}_base.py`, "
        "[pods](docs/pods.md#1-project-quotas-bucket), [web](https://example.com), [a](#b)"
    )
    assert problems_in(text, ROOT / "README.md") == []


def test_only_commands_define_flags():
    """The ast walk reads flags from the command's own file: none may come from elsewhere."""
    definers = sorted(
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*.py")
        if path.parent != PACKAGE or path.stem not in commands()
        if re.search(r"\bflags\.DEFINE|config_flags\.DEFINE", path.read_text())
    )
    assert definers == []


# --- docs/export.md's table against the exporter -------------------------------------------

EXPORT_TABLE = "| configs (`configs/*.py`) | relative bias | exported as | heads |"


@functools.cache
def exported(name: str) -> tuple[str, str]:
    """(class, "on"/"off") that `export` gives a run of configs/<name>.py: the exporter's
    own choice of class, from the frozen config as training builds it."""
    from maelm_jax.config import configdict
    from maelm_jax.hf.convert import uses_relative_bias
    from maelm_jax.hf.export import exported_class

    config = importlib.import_module("configs." + name.replace("/", ".")).get_config()
    model = configdict.freeze(config).model
    bias = not model.modern and uses_relative_bias(model)
    return exported_class(config.objective, model), "on" if bias else "off"


def config_names() -> list[str]:
    """Every config file with a get_config(), as "default" or "study/mlm"."""
    files = sorted((ROOT / "configs").rglob("*.py"))
    return [
        str(f.relative_to(ROOT / "configs").with_suffix(""))
        for f in files
        if "def get_config" in f.read_text()
    ]


def export_table_problems(text: str) -> list[str]:
    lines = text[text.index(EXPORT_TABLE) :].splitlines()[2:]
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines))
    names, claimed, problems = config_names(), {}, []
    for row in rows:
        configs, bias, exported_as = (c.strip() for c in row.strip("|").split("|")[:3])
        patterns = [p for span in CODE_SPAN.findall(configs) for p in expand_braces(span)]
        matched = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        if not matched:
            problems.append(f"export.md: row {configs!r} names no config file")
        said = (CODE_SPAN.findall(exported_as)[0], bias.split()[0])
        for name in matched:
            if name in claimed:
                problems.append(f"export.md: {name} has two rows ({claimed[name]!r}, {configs!r})")
            claimed[name] = configs
            if exported(name) != said:
                problems.append(
                    f"export.md: {name} exports as {exported(name)}, the table says {said}"
                )
    problems += [f"export.md: {n} has no row" for n in names if n not in claimed]
    return problems


def test_export_table_names_the_class_the_exporter_picks_for_every_config():
    assert export_table_problems((ROOT / "docs" / "export.md").read_text()) == []


@pytest.mark.parametrize(
    "real, planted, reported",
    [
        ("| off | `RobertaModel` |", "| off | `RobertaForMaskedLM` |",
         "three_ml_self_base exports as ('RobertaModel', 'off'), the table says"),
        ("`mlm_*` (RoBERTa's MLM) | off |", "`mlm_*` (RoBERTa's MLM) | on |",
         "the table says ('RobertaForMaskedLM', 'on')"),
        ("| `modern_mlm_*` |", "| `modern_mlm_base` |", "modern_mlm_large has no row"),
        ("`base`, `three_ml_*`", "`base`, `three_ml_*`, `default`", "default has two rows"),
    ],
)  # fmt: skip
def test_a_planted_wrong_row_in_the_export_table_is_reported(real, planted, reported):
    text = (ROOT / "docs" / "export.md").read_text()
    assert real in text
    problems = export_table_problems(text.replace(real, planted, 1))
    assert any(reported in p for p in problems), problems
