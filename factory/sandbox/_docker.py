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

__all__ = ["DockerSandbox", "docker_available", "docker_image_status", "sweep_docker_containers"]

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
    op, args = sys.argv[1], json.loads(sys.argv[2])
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


@register_sandbox("docker")
class DockerSandbox(Sandbox):
    """A container with no network, a read-only root, the syscall filter, a tmpfs quota and resource limits."""

    guarantees = frozenset(Guarantee)

    def __init__(self, spec: SandboxSpec):
        super().__init__(spec)
        self._container: Any = None
        self._stdin: Any = None  # PID 1's attached stdin: the container lives as long as this connection
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

    async def start(self) -> None:
        shared = self.spec.shared_dir
        if shared is not None and not os.path.isdir(shared):
            raise SandboxError(f"shared_dir {shared} is not a directory")
        client = await asyncio.to_thread(_engine)
        await asyncio.to_thread(_image_present, client, self.image)
        await asyncio.to_thread(_swept_once)
        try:
            await asyncio.to_thread(self._create, client)
            files = {_key(p): _as_bytes(c) for p, c in self.spec.files.items()}
            files.update({_key(p): _as_bytes(c) for p, c in self.spec.readonly_files.items()})
            seeded = await self._tool("seed", {"readonly": self._readonly, "uid": _UID}, user="0",
                                      stdin=_tar(files), cap=1 << 20)
            if seeded.exit_code != 0:
                raise SandboxError(f"seeding the workspace failed: {_tail(seeded.stderr)}")
        except BaseException:
            await self.close()
            raise

    def _create(self, client: Any) -> None:
        from docker.types import Mount, Ulimit

        limits = self.spec.limits
        mounts = []
        if self.spec.shared_dir is not None:
            mounts.append(Mount(self.spec.shared_mount or "/shared", os.path.realpath(self.spec.shared_dir),
                                type="bind"))
        # tmpfs pages are charged to the container's memory cgroup: the limit leaves room for the workspace,
        # /tmp and /dev/shm quotas (the memory that outlives a command: SysV IPC cannot, see sysctls below),
        # and room for factory's own file tool (the collected files, twice) however full they are.
        memory = limits.memory_mb + limits.workspace_mb + 2 * limits.tmp_mb + 256
        inodes = max(4096, limits.workspace_mb * 256)
        try:
            # detach=False is what makes the SDK set StdinOnce: the engine closes PID 1's stdin when this
            # process's attach connection drops (it dies), and PID 1 (cat) exits with it.
            container = client.containers.create(
                self.image, ["cat"], stdin_open=True, init=True, detach=False,
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
                labels={_LABEL: "1", f"{_LABEL}.host": socket.gethostname(),
                        f"{_LABEL}.folder": str(sandbox_folder())},
            )
        except Exception as exc:
            raise SandboxError(f"docker sandbox failed to start ({self.image}): {exc}") from exc
        self._container = container
        try:
            self._stdin = container.attach_socket(params={"stdin": 1, "stream": 1})
            container.start()
        except Exception as exc:
            raise SandboxError(f"docker sandbox failed to start ({self.image}): {exc}") from exc

    async def close(self) -> None:
        container, self._container = self._container, None
        stdin, self._stdin = self._stdin, None
        if container is None:
            return

        def remove() -> None:
            try:
                container.remove(force=True)
            except Exception:  # gone already: auto_remove, or PID 1 ended
                pass
            if stdin is not None:
                _drop(stdin)

        await asyncio.to_thread(remove)

    # ------------------------------------------------------------ commands

    def _exec_blocking(self, argv: list[str], user: str, stdin: bytes | None, cap: int, timeout: float,
                       env: dict[str, str] | None) -> _Outcome:
        """One ``exec``: feed stdin, read the multiplexed output up to ``cap``, kill at the limit or the flood."""
        if self._container is None:
            raise SandboxError("sandbox is not started")
        api = _engine().api
        started = time.monotonic()
        try:
            created = api.exec_create(self._container.id, argv, stdin=stdin is not None, user=user,
                                      workdir=_WORKSPACE, environment=env)
            sock = api.exec_start(created["Id"], socket=True)
        except Exception as exc:
            raise SandboxError(f"docker exec failed: {exc}") from exc
        # Read through the buffered reader the HTTP headers were read from: it may already hold the first frames.
        try:
            reader = sock._response.raw._fp.fp
        except AttributeError:
            reader = sock
        raw = getattr(sock, "_sock", sock)
        try:
            raw.settimeout(None)  # the client's 60 s would end a quiet command's stream early; the watchdog bounds it
        except (OSError, AttributeError):
            pass
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
            return await asyncio.to_thread(self._exec_blocking, argv, user, stdin, cap, timeout, env)

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
        await asyncio.to_thread(self._kill_all)  # nothing of the agent's changes the files while they are read
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
