"""``docker``: one container per sandbox, through the docker SDK, on an engine of this host.

The container runs the spec's image (the task's ``image``; default
:func:`~factory.sandbox.default_image_tag`, built offline by ``factory sandbox
build-image``) with:

- no network (``network_mode=none``: loopback only), a read-only root
  filesystem, ``no-new-privileges``, every capability dropped but the few
  factory's own root processes need (:data:`_ROOT_CAPABILITIES`), and the
  same syscall filter as bwrap (:func:`~factory.sandbox._seccomp.docker_seccomp_profile`);
- the workspace at ``/workspace`` and ``/tmp`` as size- and inode-limited
  tmpfs mounts (the kernel stops a command that fills them), and the spec's
  ``shared_dir`` bind-mounted at ``/shared``;
- a pids cgroup limit, a memory cgroup limit (no swap), per-process
  ``RLIMIT_AS``/``CPU``/``FSIZE`` limits, and a wall-clock and output limit per command.

Every command runs as ``nobody`` (uid 65534) with a fresh environment,
under a wrapper and ``timeout -s KILL`` that run as root: the command cannot
kill them, so when it ends (or ``timeout`` kills its process group at the
limit) the wrapper always turns into a ``nobody`` shell that runs ``kill -9
-1`` — every process of that uid in the container but itself — by
``exec``, needing no free pid even after a fork bomb. Nothing of a command
outlives it, as with bwrap (whose every command is a PID namespace of its
own). PID 1 (``docker-init`` and ``cat``) runs as root too: a policy cannot
end its own container and turn a failing branch into an infrastructure
error. The image therefore needs ``sh``, ``timeout``, ``setpriv``
(util-linux) and ``python3``.

**Files.** The engine refuses its archive API (``put_archive``) on a
container with a read-only root ("container rootfs is marked read-only"),
and for a tmpfs mount its archive calls reach a tmpfs of the daemon's own,
not the container's; a bind-mounted host folder would need a quota the
kernel enforces, which only a mount (root, in the host's namespace, left
behind by a killed run) could give. So files travel through ``exec``:
:mod:`factory.sandbox._fdtree` — the same link-safe walker the host's
backends use — runs as ``python3 -I -c`` in the container, reading a tar
stream on stdin or writing one to stdout. Seeding runs as root, once, in the
empty workspace: writable files belong to the sandbox's user; read-only
files (tests) belong to root with mode 0444, in root-owned sticky (1777)
folders on a sticky workspace root, so the agent can add files beside them
but can neither change, delete, rename nor swap a test or its folder, with
no mount to move. Reading, writing and listing run as the sandbox's user,
so following a planted link (which the walker never does) could reach no
more than the agent itself; collecting the final workspace runs as root
after every agent process is killed, so a file the agent made unreadable is
still collected.

**Cleanup.** Containers are labelled with this host and the process's
sandbox folder, and ``--rm``-like (``auto_remove``). PID 1 reads an
attached stdin that only this process holds, and the engine closes it when
the attach connection drops, so when this process dies (``kill -9``
included) PID 1 exits and the engine removes the container: the
``--die-with-parent`` of bwrap. Closing a sandbox removes its container at
once, and the first docker sandbox a process starts removes any container
whose owner's sandbox folder is no longer held (see
:func:`~factory.sandbox._scratch.folder_in_use`).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import io
import json
import math
import os
import shlex
import socket
import struct
import tarfile
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.errors import SandboxError, SandboxPathError, SandboxUnavailableError
from factory.sandbox._base import ExecResult, Guarantee, Sandbox, SandboxSpec, WorkspaceFiles, register_sandbox
from factory.sandbox._fdtree import READ_CAP, _as_bytes, workspace_parts
from factory.sandbox._host import sandbox_environment
from factory.sandbox._image import default_image_tag
from factory.sandbox._scratch import folder_in_use, sandbox_folder
from factory.sandbox._seccomp import docker_seccomp_profile

__all__ = ["DockerSandbox", "docker_available", "docker_image_status", "drain_docker_pool", "sweep_docker_containers"]

_UID = 65534
_LABEL = "factory.sandbox"
_WORKSPACE = "/workspace"
_KILL_GRACE_S = 5.0  # past the limit, the engine-side kill; past twice this, the connection is dropped
_FILE_OP_TIMEOUT_S = 60.0
_NAMES_BUDGET = 64 << 20  # bytes of a collected workspace's names and framing; past it the walk is truncated
_BUILD_HINT = ("build it offline with `factory sandbox build-image` (or `make docker-image`), or name an image "
               "that has python3, sh, timeout and setpriv (`docker build --network none` FROM it to add a repository)")
_PATH_REFUSED = 3  # the in-container file tool's exit code for a refused path
#: What root keeps in the container, for factory's own processes only: seeding and collecting files (CHOWN,
#: DAC_OVERRIDE, FOWNER), and the command wrapper (SETUID/SETGID to drop to the sandbox's user, KILL for
#: ``timeout`` to kill that user's processes). Commands run as that user with no-new-privileges: none of
#: these can come back to them.
_ROOT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETUID", "SETGID")


@functools.cache
def _client() -> Any:
    """One client per process (its connection pool serves every sandbox's threads)."""
    try:
        import docker
    except ImportError as exc:
        raise SandboxUnavailableError("the docker SDK is not installed: pip install 'factory-rlaif[docker]'") from exc
    try:
        client = docker.from_env(timeout=60, max_pool_size=64)
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types when no engine answers
        raise SandboxUnavailableError(
            f"no Docker engine answers ({exc}); start one with `make docker-engine` "
            "(as root: apt-get install docker.io, then dockerd &)") from exc
    return client


def _engine() -> Any:
    try:
        return _client()
    except SandboxUnavailableError:
        _client.cache_clear()  # an engine started later is found
        raise


def docker_available() -> tuple[bool, str]:
    """Whether a Docker engine answers here, and why not if it does not."""
    try:
        _engine()
    except SandboxUnavailableError as exc:
        return False, str(exc)
    return True, ""


def docker_image_status(image: str | None = None) -> tuple[bool, str]:
    """Whether ``image`` (default: the default image) is present on the engine, and why not if it is not."""
    name = image or default_image_tag()
    try:
        _image_present(_engine(), name)
    except SandboxUnavailableError as exc:
        return False, str(exc)
    return True, ""


def _image_present(client: Any, image: str) -> None:
    import docker.errors

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        from factory.sandbox._image import browser_image_tag

        if image == browser_image_tag():  # the browser verifier's: Chromium and Playwright on the default image
            raise SandboxUnavailableError(f"the docker image {image} (the browser verifier's: Chromium and "
                                          "Playwright) is not present: build it offline with `factory sandbox "
                                          "build-image --browser` (or `make docker-image`)") from None
        raise SandboxUnavailableError(f"the docker image {image} is not present: {_BUILD_HINT}") from None
    except docker.errors.APIError as exc:
        raise SandboxUnavailableError(f"cannot inspect the docker image {image}: {exc}") from exc


def sweep_docker_containers() -> list[str]:
    """Remove the sandbox containers of this host whose process is gone (a ``kill -9``'d run's); return their ids."""
    client = _engine()
    removed = []
    # ignore_removed: containers of other sandboxes are removed (auto_remove) while the list is inspected.
    for container in client.containers.list(all=True, ignore_removed=True,
                                            filters={"label": [f"{_LABEL}.host={socket.gethostname()}"]}):
        folder = container.labels.get(f"{_LABEL}.folder", "")
        if folder and folder_in_use(folder):
            continue
        try:
            container.remove(force=True)
        except Exception:  # removed meanwhile (auto_remove), or being removed
            continue
        removed.append(container.id)
    return removed


@functools.cache
def _swept_once() -> bool:
    try:
        sweep_docker_containers()
    except Exception:  # best effort: a sweep that races the engine never fails a sandbox's start
        return False
    return True


# ----------------------------------------------------------------------------- the in-container file tool

_TOOL_MAIN = r'''

def _main():
    import io, json, sys, tarfile
    op, args = sys.argv[1], sys.argv[2]
    # "-": the arguments are stdin's first line (a pooled container's seed exec starts before they are known)
    args = json.loads(sys.stdin.buffer.readline() if args == "-" else args)
    tree = FdTree(os.open("/workspace", _O_DIR))
    out = sys.stdout.buffer
    try:
        if op == "seed":  # as root, into the empty workspace
            readonly = set(args["readonly"])
            os.fchmod(tree._root(), 0o1777)  # the engine copies the image's folder mode onto the tmpfs
            for rel in sorted(readonly):  # root-owned sticky folders: nothing in them is renamed or swapped
                fd = os.dup(tree._root())
                for name in rel.split("/")[:-1]:
                    try:
                        os.mkdir(name, 0o1777, dir_fd=fd)
                        os.chmod(name, 0o1777, dir_fd=fd, follow_symlinks=False)
                    except FileExistsError:
                        pass
                    child = os.open(name, _O_DIR, dir_fd=fd)
                    os.close(fd)
                    fd = child
                os.close(fd)
            with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as archive:
                for member in archive:
                    data = archive.extractfile(member).read()
                    if member.name in readonly:
                        tree.write(member.name, data, mode=0o444, chown_file=False)
                    else:
                        tree.write(member.name, data, owner=args["uid"])
        elif op == "write":
            tree.readonly = dict.fromkeys(args["readonly"])
            tree.write(args["path"], sys.stdin.buffer.read())
        elif op == "read":
            out.write(tree.read_bytes(args["path"], args["cap"]))
        elif op == "list":
            out.write(json.dumps(tree.list(args["path"])).encode())
        elif op == "collect":  # as root, once every process of the sandbox's user is gone
            found = tree.collect(args["max_bytes"])
            # Names cost bytes too (tar headers, JSON): past the budget the walk counts as truncated, so the
            # answer stays within the bound the host reads, however many long names the agent made.
            kept = {"files": {}, "symlinks": {}, "special": {}, "oversized": []}
            truncated, used = found.truncated, 0
            entries = sorted([(p, "files") for p in found.files] + [(p, "symlinks") for p in found.symlinks]
                             + [(p, "special") for p in found.special] + [(p, "oversized") for p in found.oversized])
            for path, kind in entries:
                extra = found.symlinks[path] if kind == "symlinks" else ""
                cost = 1536 + 7 * (len(path.encode("utf-8", "surrogateescape")) + len(extra.encode("utf-8",
                                                                                                "surrogateescape")))
                if used + cost > args["budget"]:
                    truncated = True
                    break
                used += cost
                if kind == "oversized":
                    kept["oversized"].append(path)
                else:
                    kept[kind][path] = getattr(found, kind)[path]
            with tarfile.open(fileobj=out, mode="w|") as archive:
                manifest = json.dumps({"symlinks": kept["symlinks"], "special": kept["special"],
                                       "oversized": kept["oversized"], "truncated": truncated}).encode()
                info = tarfile.TarInfo(".")  # never a workspace path
                info.size = len(manifest)
                archive.addfile(info, io.BytesIO(manifest))
                for path, data in kept["files"].items():
                    info = tarfile.TarInfo(path)
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
    except PathRefused as exc:
        sys.stderr.write(str(exc))
        sys.exit(3)


_main()
'''


@functools.cache
def _file_tool() -> str:
    source = (Path(__file__).with_name("_fdtree.py")).read_text()
    return source + _TOOL_MAIN


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _key(path: str) -> str:
    parts = workspace_parts(path, SandboxPathError)
    return "/".join(parts) if parts else "."


# ----------------------------------------------------------------------------- exec


@dataclass
class _Outcome:
    exit_code: int
    stdout: bytes
    stderr: bytes
    flooded: bool
    timed_out: bool
    duration_s: float


def _read_exactly(stream: Any, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _drop(sock: Any) -> None:
    """Shut an exec's connection down for good (idempotent; from any thread)."""
    raw = getattr(sock, "_sock", sock)
    for call in (lambda: raw.shutdown(socket.SHUT_RDWR), sock.close):
        try:
            call()
        except (OSError, AttributeError):  # closed already
            pass


@dataclass
class _Exec:
    """An exec the engine has started, its connection open (stdin not yet fed)."""

    id: str
    sock: Any


def _exec_open(container_id: str, argv: list[str], user: str, stdin: bool, env: dict[str, str] | None) -> _Exec:
    api = _engine().api
    try:
        created = api.exec_create(container_id, argv, stdin=stdin, user=user, workdir=_WORKSPACE, environment=env)
        sock = api.exec_start(created["Id"], socket=True)
    except Exception as exc:
        raise SandboxError(f"docker exec failed: {exc}") from exc
    try:
        # the client's 60 s would end a quiet command's stream early (or a pooled seed's wait); a watchdog bounds it
        getattr(sock, "_sock", sock).settimeout(None)
    except (OSError, AttributeError):
        pass
    return _Exec(created["Id"], sock)


def _remove(container: Any, stdin: Any) -> None:
    try:
        container.remove(force=True)
    except Exception:  # gone already: auto_remove, or PID 1 ended
        pass
    if stdin is not None:
        _drop(stdin)


#: The docker SDK's calls block, and an exec's holds its thread for the command's whole run: each gets a thread of
#: its own, never the event loop's default executor (a few threads on a small machine), where a handful of long
#: commands held back every other sandbox's calls, their removals included, until one ended. Daemon threads, as
#: the pool's: one still blocked at exit never holds the interpreter (the engine removes its container then).
async def _blocking(function: Any, *args: Any) -> Any:
    """``function(*args)`` in a thread of its own, awaited."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        result, error = None, None
        try:
            result = function(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            error = exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed: nobody awaits it any more
            pass

    threading.Thread(target=run, daemon=True, name="factory-docker-call").start()
    return await future


#: Images found present on the engine by this process (one inspection per image, not one per start).
_present: set[str] = set()
#: Most pre-started containers kept per configuration (``FACTORY_DOCKER_POOL``; 0 turns the pool off).
_POOL_MAX_DEFAULT = 8
#: A pre-started container unused for this long is removed (a configuration no longer asked for).
_POOL_IDLE_S = 120.0


@dataclass
class _Launched:
    """A started container no command has touched: PID 1's stdin, and the seed exec waiting for its arguments."""

    container: Any
    stdin: Any
    seed: _Exec
    key: str | None = None  # the pool's key (None: made for one sandbox, not counted by the pool)
    made: float = 0.0


def _launch(client: Any, kwargs: dict[str, Any]) -> _Launched:
    """Create and start one container, and start its seed exec (as root, reading its arguments from stdin)."""
    image = kwargs["image"]
    try:
        container = client.containers.create(**kwargs)
    except Exception as exc:
        raise SandboxError(f"docker sandbox failed to start ({image}): {exc}") from exc
    stdin = None
    try:
        stdin = container.attach_socket(params={"stdin": 1, "stream": 1})
        container.start()
        seed = _exec_open(container.id, ["python3", "-I", "-S", "-B", "-c", _file_tool(), "seed", "-"], "0", True,
                          None)
    except Exception as exc:
        _remove(container, stdin)
        raise SandboxError(f"docker sandbox failed to start ({image}): {exc}") from exc
    return _Launched(container, stdin, seed, made=time.monotonic())


def _discard(launched: _Launched) -> None:
    _drop(launched.seed.sock)
    _remove(launched.container, launched.stdin)


class _Pool:
    """Pre-started, never-used containers by their exact creation arguments, refilled in the background.

    A container is handed out once, to one sandbox, before any command but its
    own seed step has run in it, and removed when that sandbox closes, as one
    made on demand is: nothing is ever reused. Per configuration the pool
    keeps as many ready as were recently live at once (at most
    ``FACTORY_DOCKER_POOL``); they carry the sandbox labels and their PID 1's
    stdin is held by this process, so a dead process's are removed as any
    sandbox's are, and :func:`drain_docker_pool` (also at exit) removes them.
    Closed sandboxes' removals run here too, off the caller's path.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pid = os.getpid()
        self._ready: dict[str, list[_Launched]] = {}
        self._filling: dict[str, int] = {}
        self._waiting: dict[str, int] = {}
        self._live: dict[str, int] = {}
        self._want: dict[str, int] = {}
        self._busy: set[threading.Thread] = set()  # fills and removals under way
        self._exit_hooked = False
        # Containers started ahead for one sandbox to come (see DockerSandbox.prestart), by key; None: on its way.
        self._reserved: dict[str, _Launched | None] = {}

    def _fork_check(self) -> None:
        """After ``os.fork()`` the parent's containers are the parent's: the child starts with an empty pool."""
        if self._pid != os.getpid():
            self.__init__()  # type: ignore[misc]

    def _spawn(self, target: Any, *args: Any) -> None:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._cond:
                    self._busy.discard(threading.current_thread())
                    self._cond.notify_all()

        thread = threading.Thread(target=run, daemon=True, name="factory-docker-pool")
        with self._cond:
            self._busy.add(thread)
            if not self._exit_hooked:
                self._exit_hooked = True
                atexit.register(self.drain)
        thread.start()

    def take(self, client: Any, kwargs: dict[str, Any], poolable: bool) -> _Launched:
        """A fresh started container for ``kwargs``: a reserved one, a ready one, one about to be ready, or one
        made now."""
        key = _kwargs_key(kwargs)
        self._fork_check()
        with self._cond:
            while key in self._reserved and self._reserved[key] is None:  # on its way: sooner than a new one
                self._cond.wait()
            reserved = self._reserved.pop(key, None)
        if reserved is not None:
            return reserved  # made for this sandbox alone: not counted by the pool (key None)
        size = _pool_size()
        if not poolable or size == 0:
            return _launch(client, kwargs)
        stale: list[_Launched] = []
        with self._cond:
            now = time.monotonic()
            for ready in self._ready.values():
                stale += [r for r in ready if now - r.made > _POOL_IDLE_S]
                ready[:] = [r for r in ready if now - r.made <= _POOL_IDLE_S]
            self._live[key] = self._live.get(key, 0) + 1
            self._want[key] = min(size, max(self._want.get(key, 0), self._live[key]))
            launched = None
            while launched is None:
                if self._ready.get(key):
                    launched = self._ready[key].pop()
                elif self._filling.get(key, 0) > self._waiting.get(key, 0):  # one on its way, not yet promised
                    self._waiting[key] = self._waiting.get(key, 0) + 1
                    self._cond.wait()
                    self._waiting[key] -= 1
                else:
                    break
            refill = self._want[key] - len(self._ready.get(key, ())) - self._filling.get(key, 0)
            self._filling[key] = self._filling.get(key, 0) + max(0, refill)
        for r in stale:
            self._spawn(_discard, r)
        for _ in range(max(0, refill)):
            self._spawn(self._fill, client, key, kwargs)
        try:
            if launched is None:
                launched = _launch(client, kwargs)
        except BaseException:
            self.release(key)
            raise
        launched.key = key
        return launched

    def _fill(self, client: Any, key: str, kwargs: dict[str, Any]) -> None:
        try:
            launched: _Launched | None = _launch(client, kwargs)
        except Exception:  # the next take makes its own and says why
            launched = None
        with self._cond:
            self._filling[key] -= 1
            if launched is not None and len(self._ready.get(key, ())) < self._want.get(key, 0):
                self._ready.setdefault(key, []).append(launched)
                launched = None
            self._cond.notify_all()
        if launched is not None:  # drained meanwhile
            _discard(launched)

    def reserve(self, kwargs: dict[str, Any]) -> None:
        """Start one container for exactly ``kwargs`` in the background, kept for the next take of them."""
        key = _kwargs_key(kwargs)
        self._fork_check()
        with self._cond:
            if key in self._reserved:
                return
            self._reserved[key] = None
        self._spawn(self._fill_reserved, key, kwargs)

    def _fill_reserved(self, key: str, kwargs: dict[str, Any]) -> None:
        try:
            launched: _Launched | None = _launch(_engine(), kwargs)
        except Exception:  # the take makes its own and says why
            launched = None
        with self._cond:
            if key in self._reserved and self._reserved[key] is None:
                if launched is None:
                    del self._reserved[key]
                else:
                    self._reserved[key], launched = launched, None
            self._cond.notify_all()
        if launched is not None:  # unreserved or drained meanwhile
            _discard(launched)

    def unreserve(self, kwargs: dict[str, Any]) -> None:
        """Remove the container reserved for ``kwargs`` (one on its way is removed when it is ready)."""
        with self._cond:
            launched = self._reserved.pop(_kwargs_key(kwargs), None)
            self._cond.notify_all()
        if launched is not None:
            self._spawn(_discard, launched)

    def release(self, key: str | None) -> None:
        """One sandbox of ``key`` closed."""
        if key is None:
            return
        with self._cond:
            if key in self._live:
                self._live[key] = max(0, self._live[key] - 1)

    def retire(self, container: Any, stdin: Any) -> None:
        """Remove a closed sandbox's container in the background."""
        self._spawn(_remove, container, stdin)

    def drain(self, timeout: float = 60.0) -> None:
        """Remove every ready container, and wait for the fills and removals under way."""
        self._fork_check()
        with self._cond:
            ready = [r for rs in self._ready.values() for r in rs]
            ready += [r for r in self._reserved.values() if r is not None]
            self._ready.clear()
            self._want.clear()
            self._reserved.clear()
            self._cond.notify_all()
        for launched in ready:
            self._spawn(_discard, launched)
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._busy and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))


def _kwargs_key(kwargs: dict[str, Any]) -> str:
    """The pool's key of a container configuration: its creation arguments, exactly."""
    return json.dumps(kwargs, sort_keys=True, default=str)


def _pool_size() -> int:
    value = os.environ.get("FACTORY_DOCKER_POOL", "")
    try:
        return max(0, int(value)) if value.strip() else _POOL_MAX_DEFAULT
    except ValueError:
        raise SandboxError(f"FACTORY_DOCKER_POOL must be a whole number, got {value!r}") from None


_POOL = _Pool()


def drain_docker_pool(timeout: float = 60.0) -> None:
    """Remove this process's pre-started docker containers and wait for closed sandboxes' removals.

    Runs at exit too; a sandbox started afterwards refills the pool.
    """
    _POOL.drain(timeout)


@register_sandbox("docker")
class DockerSandbox(Sandbox):
    """A container with no network, a read-only root, the syscall filter, a tmpfs quota and resource limits."""

    guarantees = frozenset(Guarantee)

    def __init__(self, spec: SandboxSpec):
        super().__init__(spec)
        self._container: Any = None
        self._stdin: Any = None  # PID 1's attached stdin: the container lives as long as this connection
        self._pool_key: str | None = None  # the pool's key of this container's configuration (None: not pooled)
        self._readonly = sorted({_key(p) for p in spec.readonly_files})
        self._lock = asyncio.Lock()
        self.image = spec.image or default_image_tag()

    @property
    def shared_path(self) -> str | None:
        return (self.spec.shared_mount or "/shared") if self.spec.shared_dir is not None else None

    @classmethod
    def preflight(cls, images: Collection[str | None] = ()) -> None:
        """An engine answers and every image is present (a missing one says how to build it)."""
        client = _engine()
        for image in sorted({image or default_image_tag() for image in images} or {default_image_tag()}):
            _image_present(client, image)

    # ------------------------------------------------------------ lifecycle

    def prestart(self) -> None:
        """Start this sandbox's container in the background, before its files are known.

        The next :meth:`start` of a sandbox with this spec's configuration (all
        but its files) takes it, seeded then as any pre-started container is,
        and never reused after. For a sandbox whose host folder is made ahead
        of time for it alone (the pool does not serve a bind mount otherwise):
        an isolated verification's solution sandbox, whose channel folder the
        warm trusted runner prepares before the verification comes. No-op with
        the pool off (``FACTORY_DOCKER_POOL=0``); :meth:`cancel_prestart` removes it.
        """
        if _pool_size():
            _POOL.reserve(self._create_kwargs())

    def cancel_prestart(self) -> None:
        """Remove the container :meth:`prestart` started for this configuration, if no sandbox took it."""
        _POOL.unreserve(self._create_kwargs())

    async def start(self) -> None:
        shared = self.spec.shared_dir
        if shared is not None and not os.path.isdir(shared):
            raise SandboxError(f"shared_dir {shared} is not a directory")
        client = await _blocking(_engine)
        if self.image not in _present:
            await _blocking(_image_present, client, self.image)
            _present.add(self.image)
        await _blocking(_swept_once)
        kwargs = self._create_kwargs()
        try:
            # A container of a bind-mounted folder is made for it (every verification's channel folder is
            # its own, so a pre-started one would be waste) unless one was prestarted for it; any other comes
            # from the pool when one is ready.
            launched = await _blocking(_POOL.take, client, kwargs, shared is None)
            files = {_key(p): _as_bytes(c) for p, c in self.spec.files.items()}
            files.update({_key(p): _as_bytes(c) for p, c in self.spec.readonly_files.items()})
            header = json.dumps({"readonly": self._readonly, "uid": _UID}).encode() + b"\n"
            for attempt in range(2):
                self._container, self._stdin, self._pool_key = launched.container, launched.stdin, launched.key
                async with self._lock:
                    seeded = await _blocking(self._exec_finish, launched.seed, header + _tar(files), 1 << 20,
                                             _FILE_OP_TIMEOUT_S, time.monotonic())
                if seeded.exit_code != 126 or attempt:
                    break
                # 126: the engine could not run the seed step in a container started ahead (runc's exec failed,
                # seen at load ~20; nothing of ours ran there): that container goes, a new one is made for this.
                _POOL.release(self._pool_key)
                _POOL.retire(self._container, self._stdin)
                self._container = self._stdin = None
                launched = await _blocking(_launch, client, kwargs)
            if seeded.exit_code == 127:
                raise SandboxUnavailableError(f"the docker image {self.image} has no python3 (the file tools need it)")
            if seeded.exit_code != 0:
                raise SandboxError(f"seeding the workspace failed: {_tail(seeded.stderr) or seeded.exit_code}")
        except BaseException:
            await self.close()
            raise

    def _create_kwargs(self) -> dict[str, Any]:
        """Everything ``containers.create`` gets for this spec: the pool's key, so a container matches exactly."""
        from docker.types import Mount, Ulimit

        limits = self.spec.limits
        mounts = []
        if self.spec.shared_dir is not None:
            mounts.append(Mount(self.spec.shared_mount or "/shared", os.path.realpath(self.spec.shared_dir),
                                type="bind"))
        # tmpfs pages are charged to the container's memory cgroup: the limit leaves room for the workspace,
        # /tmp and /dev/shm quotas (the memory that outlives a command: SysV IPC cannot, see sysctls below),
        # and room for factory's own file tool (the collected files, twice) however full they are.
        # A command whose address space RLIMIT_AS cannot bound (Chromium: V8 reserves a terabyte up front) may
        # name what its processes hold together instead: options["docker.memory_mb"] (the browser verifier's).
        processes = int(self.spec.options.get("docker.memory_mb", limits.memory_mb))
        memory = processes + limits.workspace_mb + 2 * limits.tmp_mb + 256
        inodes = max(4096, limits.workspace_mb * 256)
        # detach=False is what makes the SDK set StdinOnce: the engine closes PID 1's stdin when this
        # process's attach connection drops (it dies), and PID 1 (cat) exits with it.
        return dict(
            image=self.image, command=["cat"], stdin_open=True, init=True, detach=False,
            network_mode="none", read_only=True, user="0:0", hostname="sandbox", working_dir=_WORKSPACE,
            cap_drop=["ALL"], cap_add=list(_ROOT_CAPABILITIES),
            security_opt=["no-new-privileges:true",
                          f"seccomp={docker_seccomp_profile(no_symlinks=self.spec.no_symlinks)}"],
            pids_limit=limits.max_processes + 4,  # docker-init, cat, the wrapper and timeout
            mem_limit=f"{memory}m", memswap_limit=f"{memory}m", nano_cpus=1_000_000_000,
            ulimits=[Ulimit(name="cpu", soft=limits.cpu_seconds, hard=limits.cpu_seconds + 1),
                     Ulimit(name="fsize", soft=limits.max_file_mb << 20, hard=limits.max_file_mb << 20),
                     Ulimit(name="core", soft=0, hard=0)],
            tmpfs={_WORKSPACE: f"size={limits.workspace_mb}m,nr_inodes={inodes},mode=1777,nosuid,nodev",
                   "/tmp": f"size={limits.tmp_mb}m,mode=1777,nosuid,nodev"},
            shm_size=f"{limits.tmp_mb}m", ipc_mode="private", mounts=mounts, environment={},
            # SysV shared memory and message queues outlive the processes that made them (kill -9 -1
            # cannot reach them): segments go with their last user, queues and POSIX queues are off.
            sysctls={"kernel.shm_rmid_forced": "1", "kernel.msgmni": "0", "fs.mqueue.queues_max": "0"},
            auto_remove=True, log_config={"type": "none"},
            labels={_LABEL: "1", f"{_LABEL}.host": socket.gethostname(), f"{_LABEL}.folder": str(sandbox_folder())},
        )

    async def close(self) -> None:
        container, self._container = self._container, None
        stdin, self._stdin = self._stdin, None
        if container is None:
            return
        _POOL.release(self._pool_key)
        if self.spec.shared_dir is None:
            # Nothing of the host is mounted and there is no network: what the container still runs can reach
            # nothing the caller sees, so the engine's removal (the slow part) need not hold the caller.
            _POOL.retire(container, stdin)
        else:  # a bind-mounted folder: every process is gone before the caller reads or reuses it
            await _blocking(_remove, container, stdin)

    # ------------------------------------------------------------ commands

    def _exec_blocking(self, argv: list[str], user: str, stdin: bytes | None, cap: int, timeout: float,
                       env: dict[str, str] | None) -> _Outcome:
        """One ``exec``: feed stdin, read the multiplexed output up to ``cap``, kill at the limit or the flood."""
        if self._container is None:
            raise SandboxError("sandbox is not started")
        started = time.monotonic()
        return self._exec_finish(_exec_open(self._container.id, argv, user, stdin is not None, env), stdin, cap,
                                 timeout, started)

    def _exec_finish(self, opened: _Exec, stdin: bytes | None, cap: int, timeout: float,
                     started: float) -> _Outcome:
        """Feed an opened exec's stdin, read its output up to ``cap``, kill at the limit or the flood."""
        api = _engine().api
        created, sock = {"Id": opened.id}, opened.sock
        # Read through the buffered reader the HTTP headers were read from: it may already hold the first frames.
        try:
            reader = sock._response.raw._fp.fp
        except AttributeError:
            reader = sock
        raw = getattr(sock, "_sock", sock)
        state = {"flooded": False, "timed_out": False, "killed": False}
        done = threading.Event()

        def kill() -> None:
            if not state["killed"]:
                state["killed"] = True
                threading.Thread(target=self._kill_all, daemon=True).start()

        def watchdog() -> None:
            if not done.wait(timeout):
                state["timed_out"] = True
                kill()
                if not done.wait(_KILL_GRACE_S * 2):
                    _drop(sock)  # the engine did not end it: stop waiting

        def feed() -> None:
            try:
                if stdin:
                    raw.sendall(stdin)
                raw.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        threading.Thread(target=watchdog, daemon=True).start()
        if stdin is not None:
            threading.Thread(target=feed, daemon=True).start()
        streams: dict[int, list[bytes]] = {1: [], 2: []}
        sizes = {1: 0, 2: 0}
        try:
            while True:
                header = _read_exactly(reader, 8)
                if len(header) < 8:
                    break
                kind, size = header[0], struct.unpack(">I", header[4:])[0]
                data = _read_exactly(reader, size)
                if kind not in streams:
                    continue
                if sizes[kind] < cap:
                    streams[kind].append(data[: cap - sizes[kind]])
                sizes[kind] += len(data)
                if sizes[kind] > cap and not state["flooded"]:
                    state["flooded"] = True
                    kill()  # and keep draining until the engine closes the stream
        except (OSError, ValueError, AttributeError):  # the connection was dropped
            pass
        finally:
            done.set()
            _drop(sock)
        exit_code = -9
        for _ in range(50):
            try:
                inspected = api.exec_inspect(created["Id"])
            except Exception:
                break
            if not inspected.get("Running") and inspected.get("ExitCode") is not None:
                exit_code = inspected["ExitCode"]
                break
            time.sleep(0.02)
        if exit_code == -9 or not (0 <= exit_code < 256):  # ended without an exit status: leave nothing running
            self._kill_all()
        return _Outcome(exit_code, b"".join(streams[1]), b"".join(streams[2]), state["flooded"],
                        state["timed_out"], time.monotonic() - started)

    def _kill_all(self) -> None:
        """Kill every process of the sandbox's user (a separate exec: the command's own may be stuck)."""
        container = self._container
        if container is None:
            return
        for _ in range(5):  # a fork bomb can hold every pid for a moment
            try:
                result = container.exec_run(["sh", "-c", "kill -9 -1"], user=str(_UID))
            except Exception:
                return
            if result.exit_code in (0, 1):
                return
            time.sleep(0.2)

    async def _run(self, argv: list[str], *, user: str, stdin: bytes | None, cap: int, timeout: float,
                   env: dict[str, str] | None = None) -> _Outcome:
        async with self._lock:
            return await _blocking(self._exec_blocking, argv, user, stdin, cap, timeout, env)

    async def _tool(self, op: str, args: dict[str, Any], *, user: str = str(_UID), stdin: bytes | None = None,
                    cap: int = READ_CAP + 1) -> _Outcome:
        argv = ["python3", "-I", "-S", "-B", "-c", _file_tool(), op, json.dumps(args)]
        outcome = await self._run(argv, user=user, stdin=stdin, cap=cap, timeout=_FILE_OP_TIMEOUT_S)
        if outcome.exit_code == 127:
            raise SandboxUnavailableError(f"the docker image {self.image} has no python3 (the file tools need it)")
        if outcome.timed_out:
            raise SandboxPathError(f"{op}: timed out after {_FILE_OP_TIMEOUT_S:.0f}s")
        return outcome

    async def exec(
        self, command: str | Sequence[str], timeout: float | None = None, stdin: str | bytes | None = None
    ) -> ExecResult:
        limits = self.spec.limits
        seconds = timeout if timeout is not None else limits.timeout_s
        if not math.isfinite(seconds) or seconds <= 0:
            seconds = limits.timeout_s
        inner = command if isinstance(command, str) else shlex.join(command)
        # Nothing of an earlier command runs on into this one, nor anything of this one past it.
        # The wrapper and ``timeout`` run as root, out of the command's reach (it cannot kill them to leave
        # processes behind); the command runs as the sandbox's user; afterwards the wrapper *becomes* (exec,
        # no fork: a fork bomb may hold every pid) a shell of that user that kills every process it has.
        drop = f"setpriv --reuid={_UID} --regid={_UID} --clear-groups --inh-caps=-all --no-new-privs --"
        wrapper = (f"ulimit -v {limits.memory_mb * 1024} 2>/dev/null; "
                   f"timeout -s KILL {_seconds(seconds)} {drop} sh -c \"$1\"; status=$?; "
                   f"exec {drop} sh -c 'kill -9 -1 2>/dev/null; exit $1' sh $status")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        outcome = await self._run(["sh", "-c", wrapper, "sh", inner], user="0", stdin=data,
                                  cap=limits.max_output_bytes, timeout=seconds + _KILL_GRACE_S,
                                  env=sandbox_environment(_WORKSPACE, None))
        timed_out = outcome.timed_out or (outcome.exit_code == 137 and outcome.duration_s >= seconds)
        return ExecResult(
            exit_code=outcome.exit_code,
            stdout=outcome.stdout.decode("utf-8", errors="replace"),
            stderr=outcome.stderr.decode("utf-8", errors="replace"),
            timed_out=timed_out and not outcome.flooded,
            output_truncated=outcome.flooded,
            duration_s=outcome.duration_s,
        )

    # ------------------------------------------------------------ files

    def _refused(self, outcome: _Outcome, what: str) -> None:
        if outcome.exit_code == _PATH_REFUSED:
            raise SandboxPathError(_tail(outcome.stderr) or what)
        if outcome.exit_code != 0:
            raise SandboxPathError(f"{what}: {_tail(outcome.stderr) or f'exit code {outcome.exit_code}'}")

    async def write_file(self, path: str, content: str | bytes) -> None:
        key = _key(path)
        if key in self._readonly:
            raise SandboxPathError(f"{path} is read-only")
        outcome = await self._tool("write", {"path": key, "readonly": self._readonly}, stdin=_as_bytes(content))
        self._refused(outcome, f"cannot write {path}")

    async def read_file(self, path: str) -> str:
        outcome = await self._tool("read", {"path": _key(path), "cap": READ_CAP})
        self._refused(outcome, f"cannot read {path}")
        text = outcome.stdout[:READ_CAP].decode("utf-8", errors="replace")
        return text + ("\n[... file truncated ...]" if len(outcome.stdout) > READ_CAP else "")

    async def list_files(self, path: str = ".") -> list[str]:
        outcome = await self._tool("list", {"path": _key(path)}, cap=64 << 20)
        self._refused(outcome, f"cannot list {path}")
        try:
            listed = json.loads(outcome.stdout)
        except ValueError as exc:
            raise SandboxPathError(f"listing {path}: unreadable answer") from exc
        return sorted(str(p) for p in listed)

    async def collect_workspace(self, max_bytes: int = 64_000_000) -> WorkspaceFiles:
        await _blocking(self._kill_all)  # nothing of the agent's changes the files while they are read
        outcome = await self._tool("collect", {"max_bytes": max_bytes, "budget": _NAMES_BUDGET}, user="0",
                                   cap=max_bytes + _NAMES_BUDGET + (1 << 20))
        self._refused(outcome, "collecting the workspace")
        if outcome.flooded:  # the tool keeps within the bound, whatever the workspace holds: this is not the agent's
            raise SandboxError("collecting the workspace: the answer exceeded its bound")
        files: dict[str, bytes] = {}
        manifest: dict[str, Any] = {}
        total = 0
        truncated = False
        with tarfile.open(fileobj=io.BytesIO(outcome.stdout), mode="r|") as archive:
            for member in archive:
                extracted = archive.extractfile(member)
                data = extracted.read() if extracted is not None else b""
                if member.name == ".":
                    manifest = json.loads(data)
                    continue
                # The tool is ours, but the names are the agent's: kept exactly as they are (never stripped or
                # normalized, which could make two files one), and skipped, not raised on, if ever invalid.
                if not member.isfile() or not _walked_name(member.name) or member.name in files:
                    truncated = True
                    continue
                if total + len(data) <= max_bytes:
                    files[member.name] = data
                    total += len(data)
        return WorkspaceFiles(
            files=files,
            symlinks={str(k): str(v) for k, v in manifest.get("symlinks", {}).items()},
            special={str(k): str(v) for k, v in manifest.get("special", {}).items()},
            oversized=tuple(str(p) for p in manifest.get("oversized", [])),
            truncated=truncated or bool(manifest.get("truncated", False)),
        )


def _walked_name(name: str) -> bool:
    """A name a walk of the workspace could give: relative, no empty, ``.`` or ``..`` part, no NUL (spaces kept)."""
    return bool(name) and "\x00" not in name and not name.startswith("/") and not any(
        part in ("", ".", "..") for part in name.split("/"))


def _seconds(value: float) -> str:
    """``timeout``'s duration: at least 10 ms, rounded up to one."""
    return f"{max(0.01, math.ceil(value * 100) / 100):.2f}"


def _tail(data: bytes, limit: int = 500) -> str:
    return data.decode("utf-8", errors="replace").strip()[-limit:]
