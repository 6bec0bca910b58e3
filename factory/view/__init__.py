"""The viewer (``factory view``): a read-only web app over the store, and a static bundle of it.

Runs with their counts and pass rates, a run's task x branch grid, a task's
branches side by side (trajectories, verdicts with their details, ranking),
a diff of two branches' final workspaces, the stored ranking, and search over
final answers and tool outputs. Every read is paged (:class:`factory.store.RunBrowser`);
Starlette and uvicorn (the ``view`` extra) are imported only when an app is
built or served.
"""

from factory.view._app import create_app
from factory.view._bundle import write_bundle
from factory.view._data import ENDPOINTS, ViewData, final_workspace, pass_rate, workspace_diff
from factory.view._serve import is_loopback, serve

__all__ = [
    "ENDPOINTS",
    "ViewData",
    "create_app",
    "final_workspace",
    "is_loopback",
    "pass_rate",
    "serve",
    "workspace_diff",
    "write_bundle",
]
