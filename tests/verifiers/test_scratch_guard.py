"""The scratch area's guard in a trusted process: links in it are followed only where they stay inside.

``guard_scratch`` replaces ``open``, ``io.open`` and ``os.open`` of the
process it runs in, so each check runs a fresh interpreter (a real process,
as in the trusted sandbox) and reports what it could open. The race it
closes (a link swapped in between a check and the open) is the golden case
``peek-scratch-link-swapped-after-check``, run on bwrap by
``test_tests_verifier.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROBE = r'''
import json, os, sys
sys.path.insert(0, sys.argv[1])
from factory.verifiers._boundary import guard_scratch
scratch, outside = sys.argv[2], sys.argv[3]
guard_scratch(scratch)
results = {}


def attempt(name, action):
    try:
        results[name] = action()
    except PermissionError:
        results[name] = "refused"
    except OSError as exc:
        results[name] = f"errno {exc.errno}"


folder = os.path.join(scratch, "t")
attempt("relative link", lambda: open(os.path.join(folder, "rel")).read())
attempt("absolute link inside", lambda: open(os.path.join(folder, "abs")).read())
attempt("through a linked folder", lambda: open(os.path.join(folder, "sublink", "f")).read())
attempt("link out", lambda: open(os.path.join(folder, "out")).read())
attempt("link up and out", lambda: open(os.path.join(folder, "up")).read())
attempt("os.open link out", lambda: os.open(os.path.join(folder, "out"), os.O_RDONLY))
attempt("write through link out", lambda: open(os.path.join(folder, "out"), "w").write("x"))
attempt("loop", lambda: open(os.path.join(folder, "c0")).read())
attempt("outside itself", lambda: open(outside).read())
with open(os.path.join(folder, "dangling"), "w") as handle:  # creates the link's target, inside
    handle.write("made")
attempt("dangling link's target", lambda: open(os.path.join(folder, "new.txt")).read())
os.chdir(folder)
attempt("relative path", lambda: open("rel").read())
attempt("name kept", lambda: open(os.path.join(folder, "a.txt")).name)
print(json.dumps(results))
'''


def test_links_in_the_scratch_area_are_followed_only_inside_it(tmp_path):
    scratch, outside = tmp_path / "scratch", tmp_path / "secret.txt"
    folder = scratch / "t"
    (folder / "sub").mkdir(parents=True)
    outside.write_text("SECRET")
    (folder / "a.txt").write_text("A")
    (folder / "sub" / "f").write_text("F")
    os.symlink("a.txt", folder / "rel")
    os.symlink(folder / "a.txt", folder / "abs")
    os.symlink("sub", folder / "sublink")
    os.symlink(outside, folder / "out")
    os.symlink("../../secret.txt", folder / "up")
    os.symlink("new.txt", folder / "dangling")
    for index in range(45):  # more links than the kernel follows in one path
        os.symlink(f"c{index + 1}", folder / f"c{index}")
    (folder / "c45").write_text("end")
    result = subprocess.run([sys.executable, "-c", _PROBE, str(ROOT), str(scratch), str(outside)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "relative link": "A", "absolute link inside": "A", "through a linked folder": "F", "link out": "refused",
        "link up and out": "refused", "os.open link out": "refused", "write through link out": "refused",
        "loop": "errno 40", "outside itself": "SECRET", "dangling link's target": "made", "relative path": "A",
        "name kept": str(folder / "a.txt")}
    assert outside.read_text() == "SECRET"
