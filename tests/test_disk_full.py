"""A disk that fills up, and writers killed mid-write.

On a real small filesystem (a tmpfs mounted for the test, filled to 8 KiB
free) every writer (fork into a new store, export JSONL and Parquet,
``rank --plot``, memory, train) ends in one line naming the operation and
the path, leaves no staged file, keeps the store and every earlier output
as they were, and succeeds once space is freed. A writer killed with
``kill -9`` leaves its staged file behind: the next writer into that folder
sweeps it (a live writer's is left alone), and the ``hf:`` loader refuses a
training output that never finished.

By default the exports' full disk and the kill -9 tests run (about 10 s);
fork, rank --plot, memory and train on a full disk are opt-in: ``-m slow``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from factory.outputs import OutputFiles, is_staged

FREE_BYTES = 8 * 1024


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def listing(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (but the filler) with its sha256: what a failed writer must not change."""
    return {str(p.relative_to(folder)): digest(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "filler"}


class SmallDisk:
    """A tmpfs of ``size`` mounted at ``root``; :meth:`fill` leaves 8 KiB free, :meth:`free` gives the rest back."""

    def __init__(self, root: Path):
        self.root = root
        self.filler = root / "filler"

    def fill(self, left: int = FREE_BYTES) -> None:
        self.free()
        stats = os.statvfs(self.root)
        with self.filler.open("wb") as handle:
            remaining = stats.f_bavail * stats.f_frsize - left
            chunk = b"\0" * (1 << 20)
            while remaining > 0:
                remaining -= handle.write(chunk[:remaining])
        stats = os.statvfs(self.root)
        assert stats.f_bavail * stats.f_frsize <= left

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path) -> SmallDisk:
    """A real small filesystem: a 16 MiB tmpfs (root can mount one; elsewhere the test is skipped, saying why)."""
    root = tmp_path / "small"
    root.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(root)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield SmallDisk(root)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


@pytest.fixture
def store_copy(exported_run, tmp_path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    target = folder / "store.duckdb"
    target.write_bytes(exported_run.read_bytes())
    return target


def one_clean_line(result, operation: str, path: Path) -> None:
    """Exit 1, one line on stderr naming the operation and the path, no traceback."""
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith(f"error: {operation}: no space left on device writing "), lines[0]
    assert str(path) in lines[0], lines[0]


def no_staged(folder: Path) -> None:
    assert not [p for p in folder.rglob("*") if is_staged(p)], sorted(folder.rglob("*"))


def test_exports_on_a_full_disk_end_in_one_line_and_run_again_once_space_is_freed(cli, store_copy, small_disk):
    out = small_disk.root / "data"
    assert cli("export", "sft", "--run", "r1", "--db", store_copy, "--out", out / "sft.jsonl").exit_code == 0
    earlier, store_before = listing(small_disk.root), digest(store_copy)
    small_disk.fill()
    for name in ("dpo.jsonl", "dpo.parquet", "sft.jsonl"):  # a new file, and an earlier one written over
        result = cli("export", "dpo" if name.startswith("dpo") else "sft", "--run", "r1", "--db", store_copy,
                     "--out", out / name)
        one_clean_line(result, f"export {name.split('.')[0]}", out)
        assert listing(small_disk.root) == earlier and digest(store_copy) == store_before
        no_staged(small_disk.root)
    small_disk.free()
    for name in ("dpo.jsonl", "dpo.parquet"):
        assert cli("export", "dpo", "--run", "r1", "--db", store_copy, "--out", out / name).exit_code == 0
    assert (out / "dpo.jsonl").stat().st_size > 0 and (out / "dpo.parquet").stat().st_size > 0
    no_staged(small_disk.root)


@pytest.mark.slow  # tens of seconds (CLI subprocesses, the embedder, training): opt in with -m slow
def test_a_rank_plot_on_a_full_disk_stores_nothing_and_draws_once_space_is_freed(cli, store_copy, small_disk):
    pytest.importorskip("matplotlib", reason="matplotlib (the 'plot' extra) is not installed")
    plot = small_disk.root / "strengths.png"
    store_before = digest(store_copy)
    small_disk.fill()
    one_clean_line(cli("rank", "r1", "--db", store_copy, "--plot", plot), "rank --plot", plot)
    assert digest(store_copy) == store_before and listing(small_disk.root) == {}
    small_disk.free()
    assert cli("rank", "r1", "--db", store_copy, "--plot", plot).exit_code == 0 and plot.stat().st_size > 0


@pytest.mark.slow  # tens of seconds (CLI subprocesses, the embedder, training): opt in with -m slow
def test_memory_on_a_full_disk_leaves_the_store_as_it_was(cli, exported_run, small_disk):
    db = small_disk.root / "store.duckdb"
    db.write_bytes(exported_run.read_bytes())
    small_disk.fill()
    before = listing(small_disk.root)
    result = cli("memory", "add", "r1", "--db", db)
    one_clean_line(result, "commit to the store", db)
    after = listing(small_disk.root)
    wal = after.pop("store.duckdb.wal", None)  # DuckDB may leave its log, empty: the commit was rolled back
    assert after == before and wal in (None, hashlib.sha256(b"").hexdigest())
    no_staged(small_disk.root)
    small_disk.free()
    assert cli("memory", "add", "r1", "--db", db).exit_code == 0
    stats = json.loads(cli("memory", "stats", "--db", db, "--json").output)
    assert stats["memories"] > 0


@pytest.mark.slow  # tens of seconds (CLI subprocesses, the embedder, training): opt in with -m slow
def test_a_fork_into_a_new_store_on_a_full_disk_leaves_no_store(tmp_path, small_disk):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t0", "prompt": "What is 1 + 1?", "answer": "2"}) + "\n")
    replay = tmp_path / "replay.jsonl"
    replay.write_text(json.dumps({"response": {"text": "Final: 2", "usage": {"input_tokens": 5,
                                                                           "output_tokens": 2}}}) + "\n")
    db = small_disk.root / "new.duckdb"
    fork = [sys.executable, "-m", "factory.cli", "fork", str(tasks), "--model", f"replay:{replay}", "--db", str(db),
            "-n", "2", "--no-verify", "--sandbox", "none", "--run-id", "r1", "--json"]
    small_disk.fill()
    result = subprocess.run(fork, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: create the store: no space left on device writing ") and (
        str(db) in lines[0]), result.stderr
    assert listing(small_disk.root) == {}  # no store and no .wal left behind
    small_disk.free()
    result = subprocess.run(fork, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["branches"] == 2


def stored_branches(db: Path) -> int:
    """Branches of run r1 committed so far (0 while the store is being made or cannot be read)."""
    from factory.errors import FactoryError
    from factory.store import Store

    if not db.exists():
        return 0
    try:
        with Store.open(db, read_only=True) as store:
            return store.branches("r1").height
    except FactoryError:
        return 0


@pytest.mark.slow  # tens of seconds (CLI subprocesses, the embedder, training): opt in with -m slow
def test_a_fork_whose_disk_fills_mid_run_keeps_what_was_committed_and_resumes(tmp_path, small_disk):
    import time

    count = 20
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i:02d}", "prompt": f"What is {i} + {i}?", "answer": str(2 * i)})
                             + "\n" for i in range(count)))
    replay = tmp_path / "replay.jsonl"
    replay.write_text(json.dumps({"response": {"text": "Final: 2", "usage": {"input_tokens": 5, "output_tokens": 2}},
                                  "delay_s": 0.4}) + "\n")
    db = small_disk.root / "new.duckdb"
    fork = [sys.executable, "-m", "factory.cli", "fork", str(tasks), "--model", f"replay:{replay}", "--db", str(db),
            "-n", "1", "--no-verify", "--sandbox", "none", "--run-id", "r1", "--json"]
    child = subprocess.Popen(fork, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None and stored_branches(db) < 2:
        time.sleep(0.1)
    small_disk.fill(left=0)  # a few branches are committed; the next commit finds the disk full
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 1 and "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: commit to the store: no space left on device writing ")
    assert f"factory fork --resume r1 --db {db}" in lines[0], lines[0]
    small_disk.free()
    resumed = subprocess.run([sys.executable, "-m", "factory.cli", "fork", "--resume", "r1", "--db", str(db),
                              "--model", f"replay:{replay}", "--json"], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["branches"] == count


@pytest.mark.slow  # tens of seconds (CLI subprocesses, the embedder, training): opt in with -m slow
def test_train_on_a_full_disk_leaves_no_output_and_trains_once_space_is_freed(cli, tiny_model, small_disk,
                                                                              store_copy, tmp_path):
    pytest.importorskip("trl", reason="trl (the 'train' extra) is not installed")
    sft = tmp_path / "data" / "sft.jsonl"
    assert cli("export", "sft", "--run", "r1", "--db", store_copy, "--out", sft).exit_code == 0
    output = small_disk.root / "policy"
    train = ("train", "sft", "--data", sft, "--model", tiny_model, "--output", output, "--max-steps", "1",
             "--batch-size", "1", "--max-length", "128")
    small_disk.fill()
    one_clean_line(cli(*train), "train sft", output)
    assert listing(small_disk.root) == {}
    no_staged(small_disk.root)
    small_disk.free()
    assert cli(*train).exit_code == 0
    assert (output / "train_result.json").is_file() and (output / "model" / "config.json").is_file()
    no_staged(small_disk.root)


# ------------------------------------------------------------------ kill -9 mid-write

_STAGE_AND_WAIT = """
import sys, time
from pathlib import Path
from factory.outputs import OutputFiles
outputs = OutputFiles()
staged = outputs.stage(Path(sys.argv[1]))
with staged.open("wb") as handle:
    handle.write(b"half of an export")
    handle.flush()
    print(staged, flush=True)
    time.sleep(600)
"""


def staged_by_a_process(target: Path) -> tuple[subprocess.Popen, Path]:
    child = subprocess.Popen([sys.executable, "-c", _STAGE_AND_WAIT, str(target)], stdout=subprocess.PIPE, text=True)
    staged = Path(child.stdout.readline().strip())
    assert staged.is_file() and is_staged(staged) and f".{child.pid}-" in staged.name
    return child, staged


def test_an_export_killed_mid_write_is_swept_by_the_next_export_and_a_live_one_is_not(cli, store_copy, tmp_path):
    out = tmp_path / "data" / "dpo.jsonl"
    out.parent.mkdir()
    killed, left = staged_by_a_process(out)
    live, kept = staged_by_a_process(out)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert left.is_file()  # what kill -9 leaves: the next writer into the folder sweeps it
        assert cli("export", "dpo", "--run", "r1", "--db", store_copy, "--out", out).exit_code == 0
        assert not left.exists() and kept.is_file()  # the live writer's file is its own
    finally:
        live.kill()
        live.wait()
    with OutputFiles() as outputs:
        outputs.stage(out.with_name("other.jsonl")).write_text("{}\n")
    assert not kept.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(
        ["dpo.jsonl", "dpo.jsonl.manifest.json", "README.md", "other.jsonl"])


def test_a_training_output_that_never_finished_is_refused_by_hf_and_swept(tmp_path):
    from factory.errors import ConfigError, ModelConfigError
    from factory.models._hf import _precheck
    from factory.trainers._models import resolve_policy
    from factory.trainers._run import TrainOutputs

    output = tmp_path / "policy"
    code = ("import sys, time\nfrom pathlib import Path\nfrom factory.trainers._run import TrainOutputs\n"
            "outputs = TrainOutputs(Path(sys.argv[1]))\nfolder = outputs.stage() / 'model'\nfolder.mkdir()\n"
            "(folder / 'config.json').write_text('{}')\nprint(folder, flush=True)\ntime.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(output)], stdout=subprocess.PIPE, text=True)
    staged_model = Path(child.stdout.readline().strip())
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert staged_model.is_dir() and is_staged(staged_model.parent)
    with pytest.raises(ModelConfigError, match="not a finished training output"):
        _precheck(str(staged_model))
    with pytest.raises(ConfigError, match="not a finished training output"):
        resolve_policy(f"hf:{staged_model}")
    # a model folder that landed without its train_result.json (killed between the two renames)
    landed = output / "model"
    landed.mkdir()
    (landed / "config.json").write_text("{}")
    (landed / TrainOutputs.MARKER).write_text("")
    with pytest.raises(ModelConfigError, match="no train_result.json"):
        _precheck(str(landed))
    # the next training into the folder sweeps what the killed one staged
    TrainOutputs(output).stage()
    assert not staged_model.parent.exists()


def test_a_full_disk_no_writer_named_is_still_one_line():
    import click
    from click.testing import CliRunner

    from factory.cli._lazy import LazyGroup
    from factory.outputs import disk_full

    @click.group(cls=LazyGroup)
    def group() -> None:
        pass

    @group.command()
    def write() -> None:
        raise OSError(28, "No space left on device", "/data/out.bin")

    result = CliRunner().invoke(group, ["write"])
    assert result.exit_code == 1 and result.output == (
        "error: write: no space left on device writing /data/out.bin (free some space and run it again)\n")
    # libraries that wrap the OS error say so in words: DuckDB, safetensors, polars
    wrapped = RuntimeError('Could not write file "x.wal": No space left on device')
    assert disk_full(wrapped) == "no space left on device"
    assert disk_full(ValueError("not a disk problem")) is None
