"""Task schema and loaders: every malformed case names file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from factory.errors import TaskFileError
from factory.tasks import DEFAULT_TEST_COMMAND, Task, load_tasks

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def problems_of(path: Path) -> list[str]:
    with pytest.raises(TaskFileError) as info:
        load_tasks(path)
    return [str(p) for p in info.value.problems]


def test_examples_load_with_verifiers_and_lines():
    tasks = load_tasks(EXAMPLES / "tasks.jsonl")
    assert len(tasks) >= 10
    assert tasks.lines["add-small"] == 1
    assert tasks["add-small"].verifiers == ("answer", "judge")
    assert tasks["fix-factorial"].verifiers == ("tests", "judge")
    assert tasks["fix-is-even"].effective_test_command == DEFAULT_TEST_COMMAND
    yaml_tasks = load_tasks(EXAMPLES / "tasks.yaml")
    assert yaml_tasks["capital-france"].verifiers == ("answer", "rules")


def test_dataset_hash_is_format_and_order_independent(tmp_path, write_jsonl):
    a = {"id": "a", "prompt": "p", "answer": "1", "metadata": {"x": 1, "y": 2}}
    b = {"id": "b", "prompt": "q", "rubric": "r"}
    first = load_tasks(write_jsonl([a, b], "one.jsonl"))
    second = load_tasks(write_jsonl([b, {k: a[k] for k in reversed(list(a))}], "two.jsonl"))
    yaml_file = tmp_path / "three.yaml"
    yaml_file.write_text("tasks:\n- {id: b, prompt: q, rubric: r}\n- id: a\n  prompt: p\n  answer: 1\n"
                         "  metadata: {y: 2, x: 1}\n")
    third = load_tasks(yaml_file)
    assert first.dataset_hash == second.dataset_hash == third.dataset_hash
    assert first.dataset_hash.startswith("sha256:") and len(first.dataset_hash) == 7 + 64
    changed = load_tasks(write_jsonl([{**a, "answer": "2"}, b], "four.jsonl"))
    assert changed.dataset_hash != first.dataset_hash


def test_integer_answer_is_normalized_to_text(write_jsonl):
    tasks = load_tasks(write_jsonl([{"id": "a", "prompt": "p", "answer": 42}]))
    assert tasks["a"].answer == "42"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"id": "x", "prompt": "a"', ":1: invalid JSON: Expecting ',' delimiter (column 26)"),
        ({"id": "x"}, ":1: field 'prompt': required field is missing"),
        ({"prompt": "no id"}, ":1: field 'id': required field is missing"),
        ({"id": 7, "prompt": "p"}, ":1: field 'id': expected a string, got integer"),
        ({"id": "x", "prompt": 3}, ":1: field 'prompt': expected a string, got integer"),
        ({"id": "x", "prompt": "p", "files": ["a.py"]}, ":1: field 'files': expected an object, got array"),
        ({"id": "x", "prompt": "p", "files": {"a.py": 1}}, ":1: field 'files.a.py': expected a string, got integer"),
        ({"id": "x", "prompt": "p", "colour": "red"}, ":1: field 'colour': unknown key (allowed: id, prompt,"),
        ({"id": "x", "prompt": "p", "rules": {"max_len": 3}}, ":1: field 'rules.max_len': unknown key"),
        ([1, 2], ":1: expected a task object, got array"),
        ({"id": "x", "prompt": "p", "answer": True}, ":1: field 'answer': expected a string or integer, got boolean"),
        ({"id": "x", "prompt": "p", "answer": 1.5}, ":1: field 'answer': expected a string or integer, got number"),
        ({"id": "x", "prompt": "  "}, ":1: field 'prompt': must not be empty"),
        ({"id": "has space", "prompt": "p"}, ":1: field 'id': invalid id 'has space'"),
        ({"id": "x", "prompt": "p", "files": {"../up.py": ""}}, ":1: field 'files': file path '../up.py' must be"),
        ({"id": "x", "prompt": "p", "tests": {"/abs.py": ""}}, ":1: field 'tests': file path '/abs.py' must be"),
        ({"id": "x", "prompt": "p", "test_command": "pytest"}, ":1: test_command is set but tests is empty"),
        # a file that is also another path's folder: no workspace can hold both
        ({"id": "x", "prompt": "p", "files": {"x": "", "x/y": ""}},
         ":1: files path 'x' is a file, but files path 'x/y' needs a folder there"),
        ({"id": "x", "prompt": "p", "files": {"pkg": ""}, "hidden_tests": {"pkg/test_a.py": ""}},
         ":1: files path 'pkg' is a file, but hidden_tests path 'pkg/test_a.py' needs a folder there"),
        # names and paths longer than a file system takes
        ({"id": "x", "prompt": "p", "files": {"a" * 300 + ".py": ""}},
         ":1: field 'files': file path '" + "a" * 40 + "...' is 303 bytes long; a file or folder name is at most 255"),
        ({"id": "x", "prompt": "p", "tests": {"d/" + "é" * 128 + "/t.py": ""}},
         ":1: field 'tests': file path 'd/" + "é" * 38 + "...': name '" + "é" * 40 + "...' is 256 bytes long"),
        ({"id": "x", "prompt": "p", "files": {"/".join(["d" * 250] * 5): ""}},
         ":1: field 'files': file path '" + "d" * 40 + "...' is 1254 bytes long; at most 1024"),
        ({"id": "x", "prompt": "p", "files": {"a//b.py": "1", "a/b.py": "2"}},
         ":1: field 'files': file paths 'a//b.py' and 'a/b.py' name the same file"),
        ('{"id": "x", "prompt": "p", "prompt": "q"}', ":1: invalid JSON: duplicate key 'prompt'"),
        # image: a Docker image reference
        ({"id": "x", "prompt": "p", "image": "Python:3.12"},
         ":1: field 'image': invalid image reference 'Python:3.12': expected repository[:tag][@digest], "
         "e.g. 'python:3.12-slim' (repository path components are lowercase)"),
        ({"id": "x", "prompt": "p", "image": "python 3.12"},
         ":1: field 'image': invalid image reference 'python 3.12': it must not contain whitespace"),
        ({"id": "x", "prompt": "p", "image": "python:"}, ":1: field 'image': invalid image reference 'python:'"),
        ({"id": "x", "prompt": "p", "image": "python@sha256:abc"},
         ":1: field 'image': invalid image reference 'python@sha256:abc'"),
        ({"id": "x", "prompt": "p", "image": ""}, ":1: field 'image': must not be empty"),
        ({"id": "x", "prompt": "p", "image": 3}, ":1: field 'image': expected a string, got integer"),
    ],
)
def test_malformed_jsonl_line_is_reported_with_file_line_field(write_jsonl, line, expected):
    path = write_jsonl([line])
    problems = problems_of(path)
    assert len(problems) == 1
    assert problems[0].startswith(str(path) + expected), problems[0]


def test_every_problem_is_reported_in_line_order(write_jsonl):
    path = write_jsonl([
        {"id": "a", "prompt": "fine"},
        "",
        "not json",
        {"id": "b"},
        {"id": "a", "prompt": "again"},
        {"id": "c", "prompt": "ok"},
    ])
    problems = problems_of(path)
    assert problems == [
        f"{path}:3: invalid JSON: Expecting value (column 1)",
        f"{path}:4: field 'prompt': required field is missing",
        f"{path}:5: field 'id': duplicate id 'a' (first defined on line 1)",
    ]


def test_yaml_problems_name_the_field_line(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("- id: a\n  prompt: p\n- id: b\n  prompt: q\n  promt: typo\n  files:\n    x.py: 3\n")
    problems = problems_of(path)
    assert problems[0].startswith(f"{path}:5: field 'promt': unknown key")
    assert problems[1] == f"{path}:6: field 'files.x.py': expected a string, got integer"


def test_yaml_syntax_error_and_wrong_shape(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("- id: a\n  prompt: [unclosed\n")
    assert problems_of(broken)[0].startswith(f"{broken}:3: invalid YAML:")
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("id: a\nprompt: p\n")
    assert problems_of(mapping) == [f"{mapping}:1: expected a list of tasks, or a mapping with only 'tasks:'"]


def test_file_level_problems(tmp_path):
    assert problems_of(tmp_path / "missing.jsonl")[0].startswith(f"{tmp_path / 'missing.jsonl'}: cannot read file")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert problems_of(empty) == [f"{empty}: no tasks in file"]
    other = tmp_path / "tasks.csv"
    other.write_text("id,prompt\n")
    assert "unsupported task file type '.csv'" in problems_of(other)[0]
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b'{"id": "a", "prompt": "p"}\n\xff\xfe\n')
    assert problems_of(binary) == [f"{binary}:2: file is not valid UTF-8"]


def test_validate_command_prints_one_line_per_task(cli):
    result = cli("tasks", "validate", EXAMPLES / "tasks.jsonl")
    assert result.exit_code == 0
    lines = result.output.strip().splitlines()
    task_lines = [line for line in lines if ": " in line and "valid" not in line]
    assert len(task_lines) == len(load_tasks(EXAMPLES / "tasks.jsonl"))
    assert any(line.endswith("tests, judge") and "fix-factorial" in line for line in task_lines)
    assert lines[-1].startswith("11 task(s) valid; dataset sha256:")


def test_validate_command_json(cli):
    result = cli("tasks", "validate", EXAMPLES / "tasks.yaml", "--json")
    data = json.loads(result.output)
    assert data["tasks"][0] == {"id": "capital-france", "line": 2, "verifiers": ["answer", "rules"]}
    assert data["dataset_hash"] == load_tasks(EXAMPLES / "tasks.yaml").dataset_hash


def test_validate_command_reports_errors_without_traceback(cli, write_jsonl):
    path = write_jsonl([{"id": "a"}, {"id": "a", "prompt": "p", "x": 1}])
    result = cli("tasks", "validate", path)
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert f"{path}:1: field 'prompt': required field is missing" in result.output
    assert f"{path}:2: field 'x': unknown key" in result.output


def test_names_and_paths_at_the_file_system_limits_are_accepted(write_jsonl):
    longest_name = "n" * 252 + ".py"  # 255 bytes
    longest_path = "/".join(["d" * 254] * 4) + "/" + "f" * 3  # 1024 bytes
    tasks = load_tasks(write_jsonl([{"id": "x", "prompt": "p", "files": {longest_name: "", longest_path: ""},
                                     "tests": {"x/y/test_z.py": ""}}]))
    assert set(tasks["x"].files) == {longest_name, longest_path}


@pytest.mark.parametrize("image", [
    "python",
    "python:3.12-slim",
    "factory-sandbox:py3.11",
    "library/python:3.12",
    "localhost:5000/team/sandbox:v1",
    "ghcr.io/org_name/a__b/c---d:latest",
    "python@sha256:" + "0123456789abcdef" * 4,
    "registry.example/python:3.12@sha256:" + "a" * 64,
])
def test_docker_image_references_are_accepted(write_jsonl, image):
    tasks = load_tasks(write_jsonl([{"id": "x", "prompt": "p", "image": image}]))
    assert tasks["x"].image == image


# The hash of this task before ``image`` existed (and of the examples): a task that does not set a field
# added later keeps its hash, so runs stored before it still resume.
OLD_TASK_HASH = "sha256:d5ccd08558b9e8648b945367dab22f0ef944c2e09dcc0ad710434cee241cbebc"


def test_a_task_without_an_image_hashes_as_before():
    task = Task(id="fix-add", prompt="Fix add.", files={"add.py": "def add(a, b):\n    return a - b\n"},
                tests={"test_add.py": "from add import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"})
    assert task.image is None and "image" not in task.canonical()
    assert task.task_hash() == OLD_TASK_HASH
    with_image = task.model_copy(update={"image": "python:3.12-slim"})
    assert with_image.canonical()["image"] == "python:3.12-slim" and with_image.task_hash() != OLD_TASK_HASH


def test_check_image_reference_accepts_references_and_says_why_it_refuses_others():
    from factory.tasks import check_image_reference

    for good in ("factory-sandbox:py3.11", "localhost:5000/team/repo:v1", "python@sha256:" + "a" * 64):
        assert check_image_reference(good) == good
    for bad, why in (("Python:3", "lowercase"), ("a b", "whitespace"), (" ", "")):
        with pytest.raises(ValueError, match=why):
            check_image_reference(bad)
