"""``docker``: one container per sandbox, through the docker SDK.

The container runs a configurable image (``spec.image``; default
``python:3.11-slim`` — use an image with pytest for tests verifiers) with the
network disabled, a read-only root filesystem, memory / CPU / pids limits and
a tmpfs workspace. Commands run as ``nobody`` (uid 65534), so the read-only
files, owned by root with mode 0444, cannot be changed. Each command is
wrapped in ``timeout -s KILL`` inside the container; the SDK is imported only
when a docker sandbox starts.
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import shlex
import tarfile
import time
from collections.abc import Sequence
from typing import Any

from factory.errors import SandboxError, SandboxPathError, SandboxUnavailableError
from factory.sandbox._base import ExecResult, Guarantee, Sandbox, SandboxSpec, register_sandbox
from factory.sandbox._host import sandbox_environment

__all__ = ["DockerSandbox", "docker_available"]

DEFAULT_IMAGE = "python:3.11-slim"
_NOBODY = 65534


def _client() -> Any:
    try:
        import docker
    except ImportError as exc:
        raise SandboxUnavailableError("the docker SDK is not installed: pip install 'factory-rlaif[docker]'") from exc
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types when no engine answers
        raise SandboxUnavailableError(f"no Docker engine answers: {exc}") from exc
    return client


def docker_available() -> tuple[bool, str]:
    """Whether a Docker engine answers here, and why not if it does not."""
    try:
        _client()
    except SandboxUnavailableError as exc:
        return False, str(exc)
    return True, ""


def _bytes(content: str | bytes) -> bytes:
    return content.encode() if isinstance(content, str) else content


def _normalize(path: str) -> str:
    text = path.strip()
    if text.startswith("/workspace"):
        text = text[len("/workspace"):].lstrip("/") or "."
    if not text or text.startswith("/") or "\x00" in text:
        raise SandboxPathError(f"path {path!r} must be relative to the workspace")
    norm = posixpath.normpath(text)
    if norm == ".." or norm.startswith("../"):
        raise SandboxPathError(f"path {path!r} is outside the workspace")
    return norm


def _tar(files: dict[str, bytes], mode: int, uid: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode, uid, uid, int(time.time())
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@register_sandbox("docker")
class DockerSandbox(Sandbox):
    """A container with no network, a read-only root and resource limits."""

    # Docker's default seccomp profile refuses namespaces, mount, bpf and the keyring, but allows ptrace and
    # process_vm_* (kernels >= 4.8): not the SYSCALLS filter the conformance suite checks.
    guarantees = frozenset(Guarantee) - {Guarantee.SYSCALLS}

    def __init__(self, spec: SandboxSpec):
        super().__init__(spec)
        self._container: Any = None
        self._readonly = {_normalize(p) for p in spec.readonly_files}

    async def start(self) -> None:
        client = await asyncio.to_thread(_client)
        limits = self.spec.limits
        image = self.spec.image or DEFAULT_IMAGE

        def create() -> Any:
            container = client.containers.run(
                image, ["sleep", "infinity"], detach=True, network_disabled=True, read_only=True,
                mem_limit=f"{limits.memory_mb}m", nano_cpus=1_000_000_000, pids_limit=limits.max_processes,
                tmpfs={"/workspace": f"size={limits.workspace_mb}m,uid={_NOBODY},gid={_NOBODY},mode=0755",
                       "/tmp": f"size={limits.tmp_mb}m,mode=1777"},
                working_dir="/workspace", environment={}, auto_remove=False,
                labels={"factory.sandbox": "1"},
            )
            if self.spec.files:
                files = {_normalize(k): _bytes(v) for k, v in self.spec.files.items()}
                container.put_archive("/workspace", _tar(files, 0o644, _NOBODY))
            if self.spec.readonly_files:
                files = {_normalize(k): _bytes(v) for k, v in self.spec.readonly_files.items()}
                container.put_archive("/workspace", _tar(files, 0o444, 0))
            return container

        try:
            self._container = await asyncio.to_thread(create)
        except Exception as exc:
            raise SandboxError(f"docker sandbox failed to start ({image}): {exc}") from exc

    async def close(self) -> None:
        if self._container is not None:
            container, self._container = self._container, None
            await asyncio.to_thread(container.remove, force=True)

    async def exec(
        self, command: str | Sequence[str], timeout: float | None = None, stdin: str | bytes | None = None
    ) -> ExecResult:
        if self._container is None:
            raise SandboxError("sandbox is not started")
        limits = self.spec.limits
        seconds = timeout if timeout is not None else limits.timeout_s
        inner = command if isinstance(command, str) else shlex.join(command)
        if stdin is not None:
            data = stdin.encode() if isinstance(stdin, str) else stdin
            await asyncio.to_thread(self._container.put_archive, "/tmp", _tar({".stdin": data}, 0o444, _NOBODY))
            inner = f"({inner}) < /tmp/.stdin"
        wrapped = ["timeout", "-s", "KILL", str(max(1, int(seconds + 0.999))), "sh", "-c",
                   f"ulimit -t {limits.cpu_seconds}; {inner}"]
        env = sandbox_environment("/workspace", None)
        started = time.monotonic()

        def run() -> Any:
            return self._container.exec_run(wrapped, user=str(_NOBODY), workdir="/workspace",
                                            environment=env, demux=True)

        result = await asyncio.to_thread(run)
        stdout, stderr = result.output if result.output else (b"", b"")
        stdout, stderr = stdout or b"", stderr or b""
        cap = limits.max_output_bytes
        truncated = len(stdout) > cap or len(stderr) > cap
        return ExecResult(
            exit_code=result.exit_code if result.exit_code is not None else -9,
            stdout=stdout[:cap].decode("utf-8", errors="replace"),
            stderr=stderr[:cap].decode("utf-8", errors="replace"),
            timed_out=result.exit_code == 137 and time.monotonic() - started >= seconds,
            output_truncated=truncated,
            duration_s=time.monotonic() - started,
        )

    async def write_file(self, path: str, content: str | bytes) -> None:
        rel = _normalize(path)
        if rel in self._readonly:
            raise SandboxPathError(f"{path} is read-only")
        data = content.encode() if isinstance(content, str) else content
        await asyncio.to_thread(self._container.put_archive, "/workspace", _tar({rel: data}, 0o644, _NOBODY))

    async def read_file(self, path: str) -> str:
        rel = _normalize(path)
        result = await self.exec(["cat", "--", rel])
        if result.exit_code != 0:
            raise SandboxPathError(f"no such file: {path}")
        return result.stdout

    async def list_files(self, path: str = ".") -> list[str]:
        rel = _normalize(path)
        result = await self.exec(["find", rel, "-type", "f", "-not", "-path", "*/__pycache__/*"])
        if result.exit_code != 0:
            raise SandboxPathError(f"no such directory: {path}")
        return sorted(posixpath.normpath(line) for line in result.stdout.splitlines() if line)
