"""The task importer stages its file like every writer: one a killed import left is swept by the next writer.

(``factory view --bundle`` does the same with its folder: tests/view/test_bundle_staged.py.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from factory.outputs import is_staged
from factory.tasks import import_tasks, write_tasks

GSM8K = Path(__file__).parent / "data" / "imports" / "gsm8k" / "gsm8k.jsonl"

#: Imports GSM8K into argv[1], stalling after the first task: prints the staged file, then waits to be killed.
_STALLED_IMPORT = """
import sys, time
from pathlib import Path
from factory.tasks import import_tasks, write_tasks
out = Path(sys.argv[1])
def tasks():
    for n, task in enumerate(import_tasks("gsm8k", sys.argv[2]).tasks):
        yield task
        if n == 0:
            print(next(p for p in out.parent.iterdir() if p.name.startswith(".")), flush=True)
            time.sleep(600)
write_tasks(tasks(), out)
"""


def test_an_import_killed_mid_write_is_swept_and_the_next_one_lands(tmp_path):
    out = tmp_path / "tasks" / "gsm8k.jsonl"
    out.parent.mkdir()
    child = subprocess.Popen([sys.executable, "-c", _STALLED_IMPORT, str(out), str(GSM8K)], stdout=subprocess.PIPE,
                             text=True)
    try:
        staged = Path(child.stdout.readline().strip())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # the common staged name (the writer's pid in it), left by kill -9 with a first line written
    assert is_staged(staged) and f".{child.pid}-" in staged.name and staged.suffix == ".jsonl"
    assert staged.is_file() and not out.exists()
    written = write_tasks(import_tasks("gsm8k", GSM8K).tasks, out)
    assert written == out and sorted(p.name for p in out.parent.iterdir()) == ["gsm8k.jsonl"]
