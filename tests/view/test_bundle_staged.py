"""``factory view --bundle`` stages its folder like every writer: one a killed bundle left is swept by the next."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from factory.outputs import is_staged
from factory.store import Store

pytest.importorskip("starlette", reason="starlette (the 'view' extra) is not installed")

#: Writes a bundle of the store argv[1] into argv[2], stalling at its first answer: prints the staged folder.
_STALLED_BUNDLE = """
import sys, time
from pathlib import Path
import factory.view._bundle as bundle
from factory.store import Store
from factory.view import ViewData
def stalled(key, answer):
    print(next(p for p in Path(sys.argv[2]).parent.iterdir() if p.name.startswith(".")), flush=True)
    time.sleep(600)
bundle._script = stalled
bundle.write_bundle(ViewData(Store.open(sys.argv[1], read_only=True)), sys.argv[2])
"""


def test_a_bundle_killed_mid_write_is_swept_by_the_next_one(view_db: Path, tmp_path: Path) -> None:
    from factory.view import ViewData, write_bundle

    site = tmp_path / "site"
    child = subprocess.Popen([sys.executable, "-c", _STALLED_BUNDLE, str(view_db), str(site)],
                             stdout=subprocess.PIPE, text=True)
    try:
        staged = Path(child.stdout.readline().strip())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert staged.is_dir() and is_staged(staged) and f".{child.pid}-" in staged.name  # left by kill -9
    with Store.open(view_db, read_only=True) as store:
        write_bundle(ViewData(store), site)
    assert (site / "index.html").is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["site"]
