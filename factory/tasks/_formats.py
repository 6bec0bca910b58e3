"""The row formats: ``humaneval`` and ``mbpp`` (tests tasks), ``gsm8k`` and ``math`` (answer tasks), ``mapped``.

Code tasks get the benchmark's stub as the starter file ``solution.py`` and
its canonical code as the task's reference ``solution`` (never shown to the
agent); their tests import the solution's names by name, so they run behind
the import boundary like any task's. Answer tasks get the benchmark's final
answer normalised to what the strict ``answer`` verifier compares
(``Final: <answer>`` alone on the last line, exact match), the original kept
in ``metadata``.
"""

from __future__ import annotations

import ast
import copy
import re
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import yaml

from factory.errors import TaskFileError, TaskProblem
from factory.tasks._importers import TASK_IMPORTERS, Importer, RowError, list_field, safe_id, text_field
from factory.tasks._sources import Source

__all__ = ["GSM8KImporter", "HumanEvalImporter", "MBPPImporter", "MappedImporter", "MathImporter",
           "gsm8k_answer", "math_answer", "top_level_names"]

SOLUTION_FILE = "solution.py"


def _parse(code: str, column: str) -> ast.Module:
    try:
        return ast.parse(code)
    except SyntaxError as exc:
        raise RowError(column, f"not valid Python: {exc.msg} (line {exc.lineno})") from exc


def top_level_names(module: ast.Module) -> dict[str, ast.stmt]:
    """Names a module binds at top level by def, class or assignment (not imports)."""
    names: dict[str, ast.stmt] = {}
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
    return names


def _imports(module: ast.Module) -> dict[str, ast.stmt]:
    """Names a module binds at top level by import, with the statement that binds each."""
    bound: dict[str, ast.stmt] = {}
    for node in module.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    bound[(alias.asname or alias.name).split(".")[0]] = node
    return bound


def _used_names(*modules: ast.AST) -> set[str]:
    return {node.id for module in modules for node in ast.walk(module) if isinstance(node, ast.Name)}


def _test_header(solution: ast.Module, tests: list[ast.Module], must: set[str] = frozenset()) -> str:
    """Imports a test file needs from the solution (by name) and the solution's own imports it uses."""
    used = _used_names(*tests) | set(must)
    own = sorted(name for name in top_level_names(solution) if name in used)
    statements = sorted({ast.unparse(node) for name, node in _imports(solution).items() if name in used})
    lines = [*statements]
    if own:
        lines.append(f"from {Path(SOLUTION_FILE).stem} import {', '.join(own)}")
    return "\n".join(lines) + "\n" if lines else ""


@TASK_IMPORTERS.register("humaneval")
class HumanEvalImporter(Importer):
    """HumanEval rows (``task_id``, ``prompt``, ``entry_point``, ``test`` with ``check(candidate)``,
    ``canonical_solution``): the prompt is the starter ``solution.py``, the test a hidden test file that
    calls ``check(entry_point)``, prompt + canonical solution the reference.
    """

    name = "humaneval"
    columns = ("task_id", "prompt", "entry_point", "test")

    def source_id(self, row: Mapping[str, Any], number: int) -> str | None:
        return str(row.get("task_id"))

    def convert(self, row: Mapping[str, Any], number: int) -> dict[str, Any]:
        prompt = text_field(row, "prompt")
        entry = text_field(row, "entry_point").strip()
        test = text_field(row, "test")
        canonical = text_field(row, "canonical_solution", required=False, blank=True)
        stub = _parse(prompt, "prompt")
        if entry not in top_level_names(stub) or not isinstance(top_level_names(stub)[entry], ast.FunctionDef):
            raise RowError("entry_point", f"the prompt defines no function '{entry}'")
        test_module = _parse(test, "test")
        check = top_level_names(test_module).get("check")
        if not isinstance(check, ast.FunctionDef) or len(check.args.args) != 1:
            raise RowError("test", "expected a top-level def check(candidate)")
        solution = None
        if canonical is not None and canonical.strip():
            solution = prompt + canonical
            _parse(solution, "canonical_solution")
        header = _test_header(stub, [test_module], {entry})
        test_file = (f"{header}\n{test.strip()}\n\n\ndef test_{entry}():\n    check({entry})\n")
        task_id = safe_id(str(row["task_id"]))
        return {
            "id": task_id,
            "prompt": (f"Complete the function `{entry}` in `{SOLUTION_FILE}` so that it does what its docstring "
                       f"says. Keep its name and signature.\n\n```python\n{prompt.strip()}\n```"),
            "files": {SOLUTION_FILE: prompt},
            "hidden_tests": {f"test_{_module_name(task_id)}.py": test_file},
            "solution": {SOLUTION_FILE: solution} if solution else {},
            "metadata": {"entry_point": entry},
        }


def _module_name(task_id: str) -> str:
    return re.sub(r"\W", "_", task_id).lower()


def _stub(function: ast.FunctionDef | ast.AsyncFunctionDef, doc: str) -> str:
    """A function's signature with a docstring and ``raise NotImplementedError`` for body."""
    stub = copy.copy(function)  # the same kind of def (async or not), signature and annotations
    stub.decorator_list = []
    stub.body = [ast.Expr(ast.Constant(doc)),
                 ast.Raise(ast.Call(ast.Name("NotImplementedError", ast.Load()), [], []))]
    return ast.unparse(ast.fix_missing_locations(stub)) + "\n"


@TASK_IMPORTERS.register("mbpp")
class MBPPImporter(Importer):
    """MBPP rows (``task_id``, ``text``, ``code``, ``test_list``, ``test_setup_code``,
    ``challenge_test_list``): the stub of the functions the tests call is the starter ``solution.py``, each
    assert of ``test_list`` a visible test (the prompt shows them, as MBPP's does), each of
    ``challenge_test_list`` a hidden one, ``code`` the reference.
    """

    name = "mbpp"
    columns = ("task_id", "text", "code", "test_list")

    def source_id(self, row: Mapping[str, Any], number: int) -> str | None:
        return str(row.get("task_id"))

    def convert(self, row: Mapping[str, Any], number: int) -> dict[str, Any]:
        text = text_field(row, "text")
        code = text_field(row, "code").replace("\r\n", "\n")
        tests = list_field(row, "test_list")
        challenge = list_field(row, "challenge_test_list", required=False)
        setup = (text_field(row, "test_setup_code", required=False, blank=True) or "").replace("\r\n", "\n")
        if not tests:
            raise RowError("test_list", "no tests")
        solution = _parse(code, "code")
        parsed = [_parse(t, f"test_list.{i}") for i, t in enumerate(tests)]
        hidden = [_parse(t, f"challenge_test_list.{i}") for i, t in enumerate(challenge)]
        setup_module = _parse(setup, "test_setup_code")
        defined = top_level_names(solution)
        called = [node.func.id for module in parsed for node in ast.walk(module)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defined]
        if not called:
            raise RowError("test_list", "the tests call no function that `code` defines")
        stubs = []
        for name in dict.fromkeys(called):
            node = defined[name]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                stubs.append(_stub(node, text))
            else:
                stubs.append(f"class {name}:\n    \"\"\"{text}\"\"\"\n")
        task_id = safe_id(f"mbpp-{row['task_id']}")

        def test_file(asserts: list[str], modules: list[ast.Module]) -> str:
            header = _test_header(solution, [*modules, setup_module])
            body = "".join(f"\n\ndef test_{i}():\n{textwrap.indent(a.strip(), '    ')}\n"
                           for i, a in enumerate(asserts, start=1))
            return f"{header}{setup.strip()}\n{body}" if setup.strip() else f"{header}{body}"

        shown = "\n".join(t.strip() for t in tests)
        return {
            "id": task_id,
            "prompt": (f"{text}\nYour code should pass these tests:\n\n{shown}\n\n"
                       f"Write it in `{SOLUTION_FILE}`."),
            "files": {SOLUTION_FILE: "\n\n".join(stubs)},
            "tests": {f"test_{_module_name(task_id)}.py": test_file(tests, parsed)},
            "hidden_tests": ({f"test_{_module_name(task_id)}_challenge.py": test_file(challenge, hidden)}
                             if challenge else {}),
            "solution": {SOLUTION_FILE: code},
        }


_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def gsm8k_answer(answer: str) -> tuple[str, str]:
    """``(normalised final answer, original)`` from a GSM8K answer's last ``#### N`` line.

    The answer verifier compares ``Final: <answer>`` exactly, so the number is written one way: no
    thousands separators, no ``$`` or trailing ``.``, no ``+``, no trailing zeros after a decimal point.

    Raises:
        RowError: No ``####`` line, or what follows it is not a number.
    """
    marks = [line for line in answer.splitlines() if line.lstrip().startswith("####")]
    if not marks:
        raise RowError("answer", "no '#### <answer>' line")
    original = marks[-1].lstrip()[4:].strip()
    value = original.replace(",", "").replace("$", "").strip().rstrip(".").removeprefix("+")
    if not _NUMBER.fullmatch(value):
        raise RowError("answer", f"the '####' answer {original!r} is not a number")
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    sign = "-" if value.startswith("-") else ""
    digits = value.lstrip("-").lstrip("0") or "0"
    if digits.startswith("."):
        digits = "0" + digits
    value = sign + digits if digits != "0" else "0"
    return value, original


_ANSWER_RULE_NUMBER = ("End your reply with a last line `Final: <answer>`, the answer a number alone "
                       "(digits, no units, no thousands separators).")
_ANSWER_RULE_LATEX = ("End your reply with a last line `Final: <answer>`, the answer alone in LaTeX without "
                      "$ signs, spaces, units or thousands separators (for example `Final: \\frac{3}{4}`).")
_GROUPED_NUMBER = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")


@TASK_IMPORTERS.register("gsm8k")
class GSM8KImporter(Importer):
    """GSM8K rows (``question``, ``answer`` ending ``#### N``): an answer task whose answer is N,
    normalised; the worked solution and the original N kept in ``metadata``."""

    name = "gsm8k"
    columns = ("question", "answer")

    def convert(self, row: Mapping[str, Any], number: int) -> dict[str, Any]:
        question = text_field(row, "question")
        answer = text_field(row, "answer")
        value, original = gsm8k_answer(answer)
        prefix = self.options.get("id_prefix") or "gsm8k"
        return {
            "id": safe_id(f"{prefix}-{number}"),
            "prompt": f"{question.strip()}\n\n{_ANSWER_RULE_NUMBER}",
            "answer": value,
            "metadata": {"original_answer": original, "worked_solution": answer.rsplit("####", 1)[0].strip()},
        }


def last_boxed(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed x``) in ``text``, braces
    balanced; None if there is none."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:].removeprefix("\\boxed").removeprefix("\\fbox")
    if rest.startswith(" "):
        return rest[1:].split("$")[0].strip() or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for index, ch in enumerate(rest):
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0:
            return rest[1:index]
    return None


def _fix_fracs(text: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1b`` -> ``\\frac{1}{b}`` (MATH's own normaliser)."""
    parts = text.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{") or len(part) < 2:
            out += part
            continue
        a, b, tail = part[0], part[1], part[2:]
        if b == "{":
            out += "{" + a + "}" + b + tail
        else:
            out += "{" + a + "}{" + b + "}" + tail
    return out


def math_answer(boxed: str) -> str:
    """A MATH final answer written one way (after Hendrycks et al.'s ``strip_string``): no spaces, ``$``,
    ``\\left``/``\\right``, ``\\!``, degree marks or trailing units text; ``\\dfrac``/``\\tfrac`` as ``\\frac``;
    ``\\frac12`` braced; ``0.5`` for ``.5``; ``x=`` dropped from a lone ``x=5``."""
    text = boxed.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    text = text.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "").replace("$", "")
    text = re.sub(r"\\text\{\s*[a-zA-Z ]*(units?|cm|meters?|inches|feet|degrees|dollars|cents)\s*\}$", "", text)
    text = re.sub(r"\\(mbox|text)\{\s*\}", "", text)
    text = text.replace("\\%", "").replace("%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if text.startswith("."):
        text = "0" + text
    if len(text.split("=")) == 2 and len(text.split("=")[0].strip()) <= 2:
        text = text.split("=")[1]
    text = _fix_fracs(text.replace(" ", ""))
    if text == "0.5":
        text = "\\frac{1}{2}"
    if _GROUPED_NUMBER.fullmatch(text):  # 10,080 -> 10080: one way to write a number
        text = text.replace(",", "")
    whole_text = re.fullmatch(r"\\(?:text|textbf|mathrm)\{([^{}]*)\}", text)
    if whole_text:  # \text{neither} -> neither: the words themselves
        text = whole_text[1]
    return text


@TASK_IMPORTERS.register("math")
class MathImporter(Importer):
    """MATH rows (``problem``, ``solution`` with ``\\boxed{...}``, ``level``, ``type``): an answer task whose
    answer is the last boxed expression, normalised; the boxed original, level and type in ``metadata``."""

    name = "math"
    columns = ("problem", "solution")

    def source_id(self, row: Mapping[str, Any], number: int) -> str | None:
        return str(row["unique_id"]) if isinstance(row.get("unique_id"), str) else None

    def convert(self, row: Mapping[str, Any], number: int) -> dict[str, Any]:
        problem = text_field(row, "problem")
        solution = text_field(row, "solution")
        boxed = last_boxed(solution)
        if boxed is None or not boxed.strip():
            raise RowError("solution", "no \\boxed{...} answer (or its braces do not balance)")
        value = math_answer(boxed)
        if not value or "\n" in value:
            raise RowError("solution", f"the boxed answer {boxed!r} normalises to nothing")
        prefix = self.options.get("id_prefix") or "math"
        metadata = {"original_answer": boxed, "worked_solution": solution}
        for column in ("level", "type", "subject"):
            if isinstance(row.get(column), (str, int)):
                metadata[column] = row[column]
        return {"id": safe_id(f"{prefix}-{number}"), "prompt": f"{problem.strip()}\n\n{_ANSWER_RULE_LATEX}",
                "answer": value, "metadata": metadata}


#: Keys of a ``--map`` file, and what each names.
MAP_KEYS = {
    "id": "column holding the task id (default: <id_prefix>-<row>)",
    "id_prefix": "text before the row number when there is no id column (default: the source file's stem)",
    "prompt": "column holding the prompt",
    "prompt_template": "the prompt as text with {column} placeholders (instead of `prompt`)",
    "answer": "column holding the expected final answer (an answer task)",
    "tests": "column holding a test file's text, or an object path -> text (visible tests)",
    "hidden_tests": "column holding a test file's text, or an object path -> text (hidden tests)",
    "test_file": "path of a test file given as text (default: test_solution.py)",
    "files": "column holding the starter files, an object path -> text",
    "starter": "column holding the starter file's text (written to `solution_file`)",
    "solution": "column holding the reference solution's text, or an object path -> text",
    "solution_file": "path of a starter or solution given as text (default: solution.py)",
    "test_command": "column holding the test command",
    "rubric": "column holding a grading rubric (the LLM judge)",
    "metadata": "list of columns copied into the task's metadata",
}


@TASK_IMPORTERS.register("mapped")
class MappedImporter(Importer):
    """Any other column layout, described by a YAML map file (``--map FILE.yaml``; keys in :data:`MAP_KEYS`)::

        id: problem_id
        prompt_template: "{question}\\n\\nAnswer with a number."
        answer: final
        metadata: [difficulty, source]
    """

    name = "mapped"
    _COLUMN_KEYS: ClassVar[tuple[str, ...]] = ("id", "prompt", "answer", "tests", "hidden_tests", "files", "starter",
                                               "solution", "test_command", "rubric")

    def prepare(self, source: Source) -> None:
        map_file = self.options.get("map_file")
        if map_file is None:
            raise TaskFileError([TaskProblem(str(source.path), None, None, "the mapped format needs --map FILE.yaml")])
        self.spec = _load_map(Path(map_file))
        self.stem = self.spec.get("id_prefix") or source.path.name.split(".")[0]

    def convert(self, row: Mapping[str, Any], number: int) -> dict[str, Any]:
        spec = self.spec
        for key in self._COLUMN_KEYS:
            if key in spec and spec[key] not in row:
                raise RowError(spec[key], f"required column is missing (the map's `{key}`)")
        for column in spec.get("metadata", []):
            if column not in row:
                raise RowError(column, "required column is missing (the map's `metadata`)")
        data: dict[str, Any] = {}
        data["id"] = safe_id(str(row[spec["id"]])) if "id" in spec else safe_id(f"{self.stem}-{number}")
        if "prompt_template" in spec:
            try:
                data["prompt"] = spec["prompt_template"].format_map(row)
            except KeyError as exc:
                raise RowError(str(exc.args[0]), "required column is missing (the map's `prompt_template`)") from exc
        else:
            data["prompt"] = text_field(row, spec["prompt"])
        if "answer" in spec:
            value = row[spec["answer"]]
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise RowError(spec["answer"], f"expected a string or integer answer, got {type(value).__name__}")
            data["answer"] = str(value).strip()
        test_file = spec.get("test_file", "test_solution.py")
        solution_file = spec.get("solution_file", SOLUTION_FILE)
        for key, default in (("tests", test_file), ("hidden_tests", test_file), ("solution", solution_file)):
            if key in spec:
                data[key] = _files(row, spec[key], default)
        if "files" in spec:
            data["files"] = _files(row, spec["files"], solution_file)
        if "starter" in spec:
            data["files"] = {**data.get("files", {}), solution_file: text_field(row, spec["starter"], blank=True)}
        for key in ("test_command", "rubric"):
            if key in spec:
                data[key] = text_field(row, spec[key])
        data["metadata"] = {column: row[column] for column in spec.get("metadata", [])}
        return data

    def source_id(self, row: Mapping[str, Any], number: int) -> str | None:
        return str(row[self.spec["id"]]) if "id" in self.spec and self.spec["id"] in row else None


def _files(row: Mapping[str, Any], column: str, default_path: str) -> dict[str, str]:
    value = row[column]
    if isinstance(value, str):
        return {default_path: value} if value.strip() else {}
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return dict(value)
    raise RowError(column, "expected a file's text or an object path -> text")


def _load_map(path: Path) -> dict[str, Any]:
    """A ``--map`` file, checked: every problem named by the map file's line and key."""
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskFileError([TaskProblem(name, None, None, f"cannot read map file: {exc.strerror or exc}")]) from exc
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise TaskFileError([TaskProblem(name, mark.line + 1 if mark else None, None, f"invalid YAML: {exc}")]) from exc
    if not isinstance(data, dict) or not isinstance(node, yaml.MappingNode):
        raise TaskFileError([TaskProblem(name, None, None, "a map file is a mapping of keys to column names")])
    lines = {key.value: key.start_mark.line + 1 for key, _ in node.value if isinstance(key, yaml.ScalarNode)}
    problems = []
    for key, value in data.items():
        line = lines.get(key)
        if key not in MAP_KEYS:
            problems.append(TaskProblem(name, line, str(key), f"unknown key (allowed: {', '.join(MAP_KEYS)})"))
        elif key == "metadata":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                problems.append(TaskProblem(name, line, key, "expected a list of column names"))
        elif not isinstance(value, str) or not value.strip():
            problems.append(TaskProblem(name, line, str(key), "expected a column name (text)"))
    if "prompt" not in data and "prompt_template" not in data:
        problems.append(TaskProblem(name, None, "prompt", "the map needs `prompt` or `prompt_template`"))
    if "prompt" in data and "prompt_template" in data:
        problems.append(TaskProblem(name, lines.get("prompt_template"), "prompt_template",
                                    "give `prompt` or `prompt_template`, not both"))
    if problems:
        raise TaskFileError(problems)
    return data
