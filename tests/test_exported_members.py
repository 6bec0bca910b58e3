"""A narrow public API: each package's ``__all__`` lists what users call, and code outside reaches nothing else.

- every name in a package's ``__all__`` resolves (a lazily exported one to a
  definition in the module its package names) and is documented;
- every name in a package's ``__all__`` is used on a user-facing path: another
  package imports it, the ``factory`` console script is it, the README names
  it, or the tests import it (a public name nobody calls is internal, or dead);
- code outside a package imports its public names from the package, never its
  private modules (``factory.x._y``); the tests that reach inside say why.

Private modules keep their own ``__all__`` (what the package re-exports *from*
them, and what the same package's other modules use); nothing forces every
such name up into the package.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
import shutil
from pathlib import Path

import pytest

import factory

ROOT = Path(factory.__file__).parent
REPO = ROOT.parent
TESTS = Path(__file__).parent
PACKAGES = ["factory", *sorted(f"factory.{p.parent.name}" for p in ROOT.glob("*/__init__.py"))]

#: Test modules that import a package's private module, and why that is the right thing there.
PRIVATE_IMPORTS_IN_TESTS = {
    "tests/ranking/test_stats.py": "patches the pass@k grid limit (internal) to check both code paths",
    "tests/ranking/test_bradley_terry.py": "patches the bootstrap batch size (internal) to check that batching "
                                           "changes nothing",
    "tests/models/test_vllm.py": "checks the vLLM provider's micro-batcher (internal) without vLLM or a GPU",
    "tests/models/test_messages.py": "checks the OpenAI and Anthropic wire translation (internal to those providers) "
                                     "without their SDKs",
    "tests/sandbox/test_escapes.py": "checks the bwrap backend's seccomp filter (its syscall list and program), "
                                     "internal to the backend",
    "tests/verifiers/test_isolation.py": "checks which workspace files and module names the isolated tests run "
                                         "serves, internal to the tests verifier",
    "tests/verifiers/test_wire.py": "checks the import boundary's wire encoding, internal to the isolated tests run",
    "tests/verifiers/test_crossing_batches.py": "counts the import boundary's round trips (both ends, internal to "
                                                "the isolated tests run) on a socket pair, without a sandbox",
    "tests/test_errors.py": "drives the CLI's lazy group (internal) with commands of its own to check how it maps "
                            "the error tree to exit codes",
    "tests/sandbox/test_image.py": "checks the image builder's dpkg closure, merged-/usr path rules and rootfs "
                                   "plan (internal) without building an image",
    "tests/verifiers/test_judge.py": "checks the judge's prompt version, budget and JSON parsing, internal to "
                                     "the verifiers package",
    "tests/verifiers/test_commands.py": "checks how `python -m unittest ...` command lines become the trusted "
                                        "runner's pytest arguments (internal to the tests verifier)",
    "tests/verifiers/test_redteam_boundary.py": "checks the red team's findings in the isolated run's internals "
                                                "(JUnit node names, the NaN walk, verification in fresh sandboxes)",
    "tests/verifiers/test_warm.py": "counts the warm trusted runners an event loop's pool holds (internal to the "
                                    "isolated run), to check reuse and one runner per concurrent verification",
    "tests/trainers/test_masks.py": "builds the DPO/KTO trainers (internal) on in-memory rows to compare losses and "
                                    "gradients token by token with and without the assistant mask",
    "tests/trainers/test_precision.py": "trains a bf16-loaded policy through the trainers' internals and counts the "
                                        "trainable elements that moved (the movement probe is internal)",
    "tests/trainers/test_lengths.py": "checks how over-long prompts are cut at message boundaries (internal to the "
                                      "trainers' data preparation)",
    "tests/trainers/test_feedback_trainers.py": "builds the hint, RW-SFT and Span-KTO trainers (internal) on "
                                                "in-memory rows to measure per-turn log-probabilities, per-token "
                                                "gradients and per-span log-ratios",
    "tests/trainers/test_multi_turn.py": "builds TRL's GRPO trainer around the multi-turn sandbox environment "
                                         "(internal to `factory train grpo`) to see what the reward functions see "
                                         "and to make training fail on purpose",
    "tests/verifiers/test_scratch_guard.py": "runs the trusted bootstrap's scratch-area guard (internal to the "
                                             "isolation) in a fresh interpreter, since it replaces that process's open",
    "tests/feedback/test_feedback.py": "checks one proposal rule on a branch view it builds (the rules are internal to "
                                       "factory feedback propose)",
    "tests/feedback/test_records.py": "checks the spans export's per-message polarity resolution (internal to the "
                                      "export) against the records it reads",
    "tests/trainers/test_ensemble.py": "checks the reward ensemble's bootstrap resamples and manifest name "
                                       "(internal to `factory train reward --ensemble`)",
    "tests/verifiers/test_browser.py": "checks the browser verifier's item parsing and scoring, the task parser, "
                                       "the Anthropic image translation and the judge budget (internal) directly",
    "tests/verifiers/test_browser_plan.py": "checks the browser verifier's plan reading, repairs and default "
                                            "exploration (internal) directly, and that its action list is the "
                                            "sandboxed runner's",
    "tests/view/test_outputs.py": "holds the store's writer lock (internal to the store) to make it busy on purpose",
    "tests/memory/test_ann_index.py": "checks the IVF index file (internal to the DuckDB memory backend) directly: "
                                      "reload, a torn file, a store changed behind it, retraining",
    "tests/test_disk_full.py": "stages a training output (internal to `factory train`) in a process it kills, checks "
                               "the hf: precheck (internal to the provider) on it, and the CLI group's full-disk line",
}


def source_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def suite_sources(tests: Path) -> list[Path]:
    """The suite's own modules: not the third-party libraries vendored under ``data/realworld`` as test data."""
    vendored = tests / "data" / "realworld"
    return [p for p in source_files(tests) if not p.is_relative_to(vendored)]


def dotted(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str:
    """``factory.x`` for anything under ``factory/x/``; ``factory`` for top-level modules."""
    parts = module.split(".")
    if len(parts) > 1 and (ROOT / parts[1] / "__init__.py").exists():
        return ".".join(parts[:2])
    return "factory"


def public_names(package: str) -> list[str]:
    return list(importlib.import_module(package).__all__)


def package_dir(package: str) -> Path:
    return ROOT if package == "factory" else ROOT / package.split(".")[1]


def package_sources(package: str) -> list[Path]:
    if package == "factory":
        return sorted(ROOT.glob("*.py"))
    return source_files(package_dir(package))


def lazy_map(package: str) -> dict[str, str]:
    """Lazily exported name -> private module (``_LAZY`` beside a PEP 562 ``__getattr__``)."""
    return dict(getattr(importlib.import_module(package), "_LAZY", {}))


# ------------------------------------------------------------------ resolve and document


def parsed(path: Path) -> ast.Module:
    return parsed_text(path.read_text())


@functools.cache
def parsed_text(code: str) -> ast.Module:
    """``code`` parsed once per session: the planted-import checks re-read whole copies of the package that differ
    from it in one file."""
    return ast.parse(code)


@functools.cache
def definitions(path: Path) -> dict[str, tuple[ast.stmt, bool]]:
    """Top-level names a module defines -> (node, documented)."""
    tree = parsed(path)
    lines = path.read_text().splitlines()
    found: dict[str, tuple[ast.stmt, bool]] = {}
    body = tree.body
    for index, node in enumerate(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = (node, ast.get_docstring(node) is not None)
            continue
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
        else:
            continue
        following = body[index + 1] if index + 1 < len(body) else None
        string_after = isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) \
            and isinstance(following.value.value, str)
        comment_above = node.lineno >= 2 and lines[node.lineno - 2].lstrip().startswith("#")
        for target in targets:
            found[target] = (node, string_after or comment_above)
    return found


def definition_of(package: str, name: str) -> tuple[Path, bool] | None:
    """Where ``name`` is defined (the package's own modules first, then anywhere in factory), and documented?"""
    for path in [*package_sources(package), *source_files(ROOT)]:
        defined = definitions(path).get(name)
        if defined is not None:
            return path, defined[1]
    return None


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves(package):
    module = importlib.import_module(package)
    names = public_names(package)
    assert len(names) == len(set(names)), f"{package}.__all__ repeats a name"
    lazy = lazy_map(package)
    for name in names:
        if name in lazy:
            # checked without importing it: the module may need an optional extra
            source = package_dir(package) / f"{lazy[name]}.py"
            assert name in definitions(source), f"{package}.{name} is lazily taken from {source}, which lacks it"
            try:
                getattr(module, name)
            except ModuleNotFoundError as exc:
                assert exc.name and not exc.name.startswith("factory"), exc
            continue
        assert hasattr(module, name), f"{package}.__all__ names {name}, which the package does not have"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_is_documented(package):
    undocumented = []
    for name in public_names(package):
        if name == "__version__":
            continue
        where = definition_of(package, name)
        assert where is not None, f"{package}.{name} is defined nowhere in factory/"
        if not where[1]:
            undocumented.append(f"{name} ({where[0].relative_to(REPO)})")
    assert not undocumented, (f"{package}: public names without a docstring (or, for a constant, a comment "
                              f"above or a string below): {undocumented}")


# ------------------------------------------------------------------ used on a user-facing path


@functools.cache
def import_facts(tree: ast.AST) -> tuple[tuple[tuple[str, tuple[tuple[str, str], ...]], ...], tuple[str, ...],
                                         tuple[tuple[str, str], ...]]:
    """One walk of ``tree``: its absolute ``from`` imports (module, ((name, bound name), ...)), its plain imports
    (module, bound name) and its attribute chains (dotted base, attribute); every package's question reads these."""
    froms, imports, chains = [], [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level:
            froms.append((node.module or "", tuple((a.name, a.asname or a.name) for a in node.names)))
        elif isinstance(node, ast.Import):
            imports.extend((alias.name, alias.asname or alias.name) for alias in node.names)
        elif isinstance(node, ast.Attribute):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name):
                chain.append(value.id)
                chains.append((".".join(reversed(chain[1:])), node.attr))
    return tuple(froms), tuple(imports), tuple(chains)


def imports_from(tree: ast.AST, package: str) -> set[str]:
    """Names taken from ``package``: ``from package import x`` and ``alias.x`` where ``alias`` is the package."""
    froms, imports, chains = import_facts(tree)
    names: set[str] = set()
    aliases: set[str] = set()
    parent, _, leaf = package.rpartition(".")
    for module, bound in froms:
        if module == package:
            names.update(name for name, _ in bound)
        elif parent and module == parent:
            aliases.update(alias for name, alias in bound if name == leaf)
    aliases.update(alias for module, alias in imports if module == package)
    names.update(attr for base, attr in chains if base in aliases)
    return names


def users(package: str) -> dict[str, set[str]]:
    """Public name -> the user-facing places that use it."""
    used: dict[str, set[str]] = {}

    def note(names, where):
        for name in names:
            used.setdefault(name, set()).add(where)

    for path in source_files(ROOT):
        if package_of(dotted(path, REPO)) != package:
            note(imports_from(parsed(path), package), str(path.relative_to(REPO)))
    for path in suite_sources(TESTS):
        if path.name != Path(__file__).name:
            note(imports_from(parsed(path), package), str(path.relative_to(REPO)))
    readme = (REPO / "README.md").read_text()
    code = " ".join(re.findall(r"```.*?```|`[^`\n]+`", readme, re.DOTALL))  # code spans and blocks only
    note({n for n in public_names(package) if re.search(rf"\b{re.escape(n)}\b", code)}, "README.md")
    scripts = re.findall(r'^\w[\w-]* = "([\w.]+):(\w+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    note({attr for module, attr in scripts if module == package}, "pyproject.toml [project.scripts]")
    return used


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_has_a_user(package):
    used = users(package)
    unused = [name for name in public_names(package) if name not in used and name != "__version__"]
    assert not unused, (f"{package}.__all__ lists names no other package, README, console script or test uses: "
                        f"{unused} (make them internal, or dead code goes)")


# ------------------------------------------------------------------ private modules stay private


@functools.cache
def private_imports(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """(line, target) of every import of another package's private module in ``tree``."""
    found = []
    own = package_of(module) if module.startswith("factory") else None
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[0] != "factory" or not any(p.startswith("_") and not p.startswith("__") for p in parts[1:]):
                continue
            if package_of(target) == "factory":  # the root's own helpers (factory._version, _lazy_exports)
                continue
            if package_of(target) != own:
                found.append((node.lineno, target))
                break
    return found


def private_import_violations(root: Path, tests: Path | None = None) -> list[str]:
    problems = []
    for path in source_files(root):
        module = dotted(path, root.parent)
        problems += [f"{path}:{line}: {module} imports {target}" for line, target in
                     private_imports(parsed_text(path.read_text()), module)]
    if tests is not None:
        for path in suite_sources(tests):
            relative = f"tests/{path.relative_to(tests)}"
            if relative in PRIVATE_IMPORTS_IN_TESTS:
                continue
            problems += [f"{relative}:{line}: imports {target}" for line, target in
                         private_imports(parsed_text(path.read_text()), "tests")]
    return problems


def test_private_modules_are_imported_only_by_their_package():
    assert private_import_violations(ROOT, TESTS) == []


def test_tests_that_reach_inside_still_do():
    """An entry in PRIVATE_IMPORTS_IN_TESTS that no longer imports a private module goes."""
    for relative in PRIVATE_IMPORTS_IN_TESTS:
        path = REPO / relative
        assert path.exists(), f"{relative} is gone: drop it from PRIVATE_IMPORTS_IN_TESTS"
        code = path.read_text()
        assert private_imports(ast.parse(code), "tests") or re.search(r"factory\.\w+\._\w+", code), \
            f"{relative} no longer reaches inside a package: drop it from PRIVATE_IMPORTS_IN_TESTS"


@pytest.mark.parametrize(("module", "line"), [
    ("verifiers/_pipeline.py", "from factory.models._base import ChatModel\n"),
    ("cli/_query.py", "def f():\n    from factory.store._store import Store\n"),
    ("rollouts/_agent.py", "import factory.sandbox._host\n"),
    ("export/_files.py", "from factory.store import _migrations\n"),
])
def test_a_private_import_across_packages_fails(tmp_path, module, line):
    """The check is not vacuous: planting one (lazy, module-form and ``from pkg import _mod`` too) is caught."""
    copy = tmp_path / "factory"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = set(private_import_violations(copy))
    target = copy / module
    target.write_text(target.read_text() + "\n" + line)
    problems = sorted(set(private_import_violations(copy)) - before)
    assert len(problems) == 1 and module in problems[0], problems


def test_a_private_import_inside_its_own_package_is_fine(tmp_path):
    copy = tmp_path / "factory"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = private_import_violations(copy)
    target = copy / "models" / "_replay.py"
    target.write_text(target.read_text() + "\nfrom factory.models._base import ChatModel\n")
    assert private_import_violations(copy) == before


def test_the_usage_check_sees_imports_and_attribute_access(tmp_path):
    """``from factory.x import n``, ``import factory.x as m; m.n`` and ``from factory import x; x.n`` all count."""
    code = ("from factory.models import create_model\nimport factory.sandbox as sb\nfrom factory import store\n"
            "sb.create_sandbox\nstore.Store\nimport factory.ranking\nfactory.ranking.powered\n")
    tree = ast.parse(code)
    assert imports_from(tree, "factory.models") == {"create_model"}
    assert imports_from(tree, "factory.sandbox") == {"create_sandbox"}
    assert imports_from(tree, "factory.store") == {"Store"}
    assert imports_from(tree, "factory.ranking") == {"powered"}
