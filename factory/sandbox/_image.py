"""The docker sandbox's default image, built here and offline.

No image registry is needed: the root filesystem is assembled from what this
host already has — the files of a few installed Debian packages (a shell,
coreutils, awk, ...) and the dependencies they declare, the running Python
interpreter relocated to ``/usr/local`` with the shared libraries ``ldd``
reports for it, and pytest with its runtime dependencies copied from the
running environment — written as one tarball in a deterministic order and
handed to ``docker import``. A smoke test then runs the image with no
network, read-only, as ``nobody``.

The browser image (:func:`browser_image_tag`, ``build_image(browser=True)``)
is the same plus Debian's ``chromium`` with the packages it declares and a few
fonts, and Playwright's Python client (its Node driver included) copied from
the running environment as pytest is: what the ``browser`` verifier's runner
needs on the docker backend. It is a separate tag, so the default image stays
small; its smoke test drives Chromium headless through Playwright.

On a host without ``dpkg`` build an image another way: a Dockerfile ``FROM``
any image with ``python3`` and ``pytest``, built with ``docker build
--network none``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from factory._version import __version__
from factory.errors import SandboxError, SandboxUnavailableError

__all__ = ["ImageBuild", "browser_image_tag", "build_image", "default_image_tag"]

#: Packages whose files (and whose dependencies' files) make the image's userland.
#: ``awk`` is virtual: the installed package that provides it (mawk, gawk, ...) is used.
BASE_PACKAGES = (
    "dash", "bash", "coreutils", "findutils", "grep", "sed", "awk", "diffutils",
    "tar", "gzip", "procps", "util-linux", "libc-bin", "make",
)

#: Added for the browser image: Debian's Chromium (its declared dependencies resolved like the base's) and
#: fonts with the metrics of the common web fonts (Chromium renders boxes without any font fontconfig finds).
BROWSER_PACKAGES = ("chromium", "fontconfig-config", "fonts-dejavu-core", "fonts-liberation")
#: Declared but never loaded by Chromium headless with ``--disable-gpu`` (it renders in software, SwiftShader
#: being its own): Mesa's hardware drivers are 13 hard links of one 26 MB file and pull in LLVM (117 MB)
#: and z3 (23 MB). Left out with whatever only they need; ``ldd`` of Chromium adds any library it does link.
BROWSER_OMITTED = ("libgl1-mesa-dri",)
#: Python distributions (with their requirement closures) the browser image adds to pytest's.
BROWSER_DISTRIBUTIONS = ("playwright",)
#: Where the browser image's Chromium is (Debian's binary; ``/usr/bin/chromium`` is a wrapper script).
BROWSER_CHROMIUM = "/usr/lib/chromium/chromium"

#: Documentation and translations: nothing in a sandbox reads them.
EXCLUDED_PREFIXES = (
    "/usr/share/doc", "/usr/share/man", "/usr/share/info", "/usr/share/locale", "/usr/share/lintian",
)

#: Parts of the standard library that tests never need (``site-packages`` is filled separately).
STDLIB_EXCLUDED = ("test", "site-packages", "dist-packages", "idlelib", "tkinter", "turtledemo", "ensurepip")

#: Empty directories of the image and their modes.
EMPTY_DIRS = {
    "workspace": 0o755, "shared": 0o755, "proc": 0o555, "sys": 0o555, "dev": 0o755, "run": 0o755,
    "home": 0o755, "root": 0o700, "tmp": 0o1777, "var/tmp": 0o1777,
}

#: The image's fixed environment, as ``docker import`` changes.
IMAGE_PATH = "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Top-level directories that a merged-/usr host makes symlinks into ``usr/``.
MERGED_USR_LINKS = ("bin", "lib", "lib32", "lib64", "libx32", "sbin")

_ENGINE_HINT = (
    "start one with `make docker-engine`, or as root: `apt-get install docker.io` then `dockerd &`"
)
_NO_DPKG_HINT = (
    "the image builder copies files of installed Debian packages and needs a Debian-like host with dpkg; "
    "elsewhere build an image from a Dockerfile FROM any image with python3 and pytest "
    "(`docker build --network none -t TAG .`) and name it in the task's `image`"
)


@dataclass(frozen=True)
class ImageBuild:
    """What :func:`build_image` built.

    Attributes:
        tag: The image's tag (``factory-sandbox:py3.11``).
        image_id: The engine's image id (``sha256:...``).
        size_bytes: The image's size as the engine reports it.
        python_version: The image's Python (that of the interpreter that built it).
        pytest_version: The image's pytest.
        seconds: Wall-clock seconds the build and smoke test took.
        packages: The Debian packages whose files the image holds, sorted.
        content_hash: SHA-256 of the root filesystem tarball (label ``factory.image.hash``).
    """

    tag: str
    image_id: str
    size_bytes: int
    python_version: str
    pytest_version: str
    seconds: float
    packages: tuple[str, ...] = field(default_factory=tuple)
    content_hash: str = ""


def default_image_tag() -> str:
    """The default image's tag for the running interpreter: ``factory-sandbox:py3.11``."""
    return f"factory-sandbox:py{sys.version_info.major}.{sys.version_info.minor}"


def browser_image_tag() -> str:
    """The browser image's tag for the running interpreter: ``factory-sandbox-browser:py3.11``."""
    return f"factory-sandbox-browser:py{sys.version_info.major}.{sys.version_info.minor}"


# ---------------------------------------------------------------- dpkg


@dataclass(frozen=True)
class InstalledPackage:
    """One installed Debian package, as ``dpkg-query`` reports it.

    Attributes:
        name: The bare package name (``libc6``).
        qualified: The name ``dpkg -L`` takes (``libc6:amd64`` for a Multi-Arch: same package).
        depends: Depends then Pre-Depends; each item lists the alternatives of one dependency.
        provides: Virtual package names it provides.
    """

    name: str
    qualified: str
    depends: tuple[tuple[str, ...], ...]
    provides: tuple[str, ...]


#: The ``dpkg-query -W`` format :func:`parse_dpkg_status` reads.
DPKG_FORMAT = "\\t".join([
    "${Package}", "${binary:Package}", "${Architecture}", "${db:Status-Abbrev}", "${Depends}", "${Pre-Depends}",
    "${Provides}\\n",
])


def _relation_names(field_text: str) -> tuple[tuple[str, ...], ...]:
    """``"libc6 (>= 2.34), a | b:any"`` -> ``(("libc6",), ("a", "b"))``: names without versions or arch."""
    items = []
    for item in field_text.split(","):
        names = tuple(
            re.split(r"[\s(:\[<]", alternative.strip(), maxsplit=1)[0] for alternative in item.split("|")
        )
        names = tuple(n for n in names if n)
        if names:
            items.append(names)
    return tuple(items)


def parse_dpkg_status(text: str, native_arch: str = "amd64") -> dict[str, InstalledPackage]:
    """Installed packages from ``dpkg-query -W -f DPKG_FORMAT`` output, by bare name.

    Packages not fully installed (status other than ``ii``) are left out; where
    several architectures of one name are installed, the native (or ``all``) one wins.
    """
    packages: dict[str, InstalledPackage] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 7:
            continue
        name, qualified, arch, status, depends, pre_depends, provides = parts[:7]
        if not status.startswith("ii"):
            continue
        if name in packages and arch not in (native_arch, "all"):
            continue
        packages[name] = InstalledPackage(
            name=name,
            qualified=qualified or name,
            depends=_relation_names(depends) + _relation_names(pre_depends),
            provides=tuple(alt[0] for alt in _relation_names(provides)),
        )
    return packages


def package_closure(installed: dict[str, InstalledPackage], base: Iterable[str],
                    omit: Iterable[str] = ()) -> list[str]:
    """The installed packages named in ``base`` plus everything they depend on, as ``dpkg -L`` names.

    A name that is not installed is looked up among the virtual packages
    installed ones provide; of a dependency's alternatives the first installed
    one is taken; names that resolve to nothing are skipped, and so are the
    packages in ``omit`` (nor are their dependencies followed through them).
    """
    providers: dict[str, str] = {}
    for package in sorted(installed.values(), key=lambda p: p.name):
        for virtual in package.provides:
            providers.setdefault(virtual, package.name)

    def resolve(name: str) -> str | None:
        if name in installed:
            return name
        return providers.get(name)

    chosen: set[str] = set(omit)
    pending = [n for n in (resolve(b) for b in base) if n]
    while pending:
        name = pending.pop()
        if name in chosen:
            continue
        chosen.add(name)
        for alternatives in installed[name].depends:
            pick = next((r for r in (resolve(a) for a in alternatives) if r), None)
            if pick and pick not in chosen:
                pending.append(pick)
    return sorted(installed[n].qualified for n in chosen - set(omit) if n in installed)


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def _dpkg_packages(extra: tuple[str, ...] = ()) -> list[str]:
    if shutil.which("dpkg-query") is None or shutil.which("dpkg") is None:
        raise SandboxUnavailableError(_NO_DPKG_HINT)
    arch = _run(["dpkg", "--print-architecture"]).strip()
    installed = parse_dpkg_status(_run(["dpkg-query", "-W", "-f", DPKG_FORMAT]), arch)
    missing = [name for name in extra if name not in installed]
    if missing:
        raise SandboxUnavailableError(
            f"the browser image copies installed Debian packages and {', '.join(missing)} is not installed here: "
            "`apt-get install chromium fonts-liberation` (make setup installs chromium)")
    return package_closure(installed, BASE_PACKAGES + extra, BROWSER_OMITTED if extra else ())


def _dpkg_files(packages: list[str]) -> list[str]:
    # dpkg -L also prints "diverted by ..." notes; only absolute paths are files.
    listing = _run(["dpkg", "-L", *packages])
    return sorted({line for line in listing.splitlines() if line.startswith("/")})


# ---------------------------------------------------------------- paths


def canonical_path(path: str, root: str = "/") -> str:
    """Where ``path`` really lives under ``root``, with every directory symlink resolved.

    The last component is kept as is (it may itself be a symlink to copy), so
    on a merged-/usr host ``/bin/bash`` becomes ``/usr/bin/bash`` and
    ``/lib64/ld-linux-x86-64.so.2`` becomes ``/usr/lib64/ld-linux-x86-64.so.2``.
    """
    root_real = os.path.realpath(root)
    parent, name = os.path.split(os.path.normpath("/" + path.lstrip("/")))
    real_parent = os.path.realpath(os.path.join(root_real, parent.lstrip("/")))
    relative = os.path.relpath(real_parent, root_real)
    if relative == ".":
        return "/" + name
    if relative.startswith(".."):
        raise ValueError(f"{path} resolves outside {root}")
    return "/" + relative + "/" + name


def is_excluded(path: str) -> bool:
    """Whether a canonical path is documentation or translations left out of the image."""
    return any(path == p or path.startswith(p + "/") for p in EXCLUDED_PREFIXES)


def stdlib_excluded(relative: str, version: str) -> bool:
    """Whether a path relative to ``lib/pythonX.Y`` is left out (tests, IDLE, Tk, site-packages, ...)."""
    top = relative.split("/", 1)[0]
    return top in STDLIB_EXCLUDED or top.startswith(f"config-{version}")


def etc_files() -> dict[str, bytes]:
    """The image's generated account files: root and nobody only, files-only name service."""
    return {
        "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "etc/group": b"root:x:0:\nnogroup:x:65534:\n",
        "etc/nsswitch.conf": b"passwd: files\ngroup: files\nshadow: files\nhosts: files\n"
                             b"networks: files\nprotocols: files\nservices: files\n",
        "etc/hostname": b"sandbox\n",
    }


# ---------------------------------------------------------------- the rootfs plan


@dataclass
class _Member:
    kind: str  # "file" (a host file), "data", "symlink", "dir"
    source: str = ""
    data: bytes = b""
    mode: int = 0o644


class RootfsPlan:
    """The image's files, by path inside the image (no leading slash), before they are written."""

    def __init__(self) -> None:
        self.members: dict[str, _Member] = {}

    def __contains__(self, path: str) -> bool:
        return path.strip("/") in self.members

    def add_dir(self, path: str, mode: int = 0o755) -> None:
        """A directory (its parents too, mode 0755 unless already planned)."""
        name = path.strip("/")
        if name and name not in self.members:
            self._parents(name)
            self.members[name] = _Member("dir", mode=mode)

    def add_data(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """A generated file."""
        name = path.strip("/")
        self._parents(name)
        self.members[name] = _Member("data", data=data, mode=mode)

    def add_symlink(self, path: str, target: str) -> None:
        """A symlink, kept as a symlink."""
        name = path.strip("/")
        self._parents(name)
        self.members[name] = _Member("symlink", source=target)

    def add_host(self, host: str, dest: str | None = None, *, follow: bool = True) -> None:
        """A host path (file, directory or symlink) at ``dest`` (its canonical path if None).

        With ``follow``, a symlink's target is added too, so that links in the
        image never dangle for lack of a file the host has.
        """
        if not os.path.lexists(host):
            return
        name = (dest or canonical_path(host)).strip("/")
        if not name or name in self.members:
            return
        info = os.lstat(host)
        if os.path.islink(host):
            target = os.readlink(host)
            self.add_symlink(name, target)
            if follow and dest is None:
                resolved = target if target.startswith("/") else os.path.join(os.path.dirname(host), target)
                if not is_excluded(canonical_path(resolved)):
                    self.add_host(resolved)
        elif os.path.isdir(host):
            self.add_dir(name, info.st_mode & 0o7777)
        elif os.path.isfile(host):
            self._parents(name)
            self.members[name] = _Member("file", source=host, mode=info.st_mode & 0o7777)

    def _parents(self, name: str) -> None:
        parent = os.path.dirname(name)
        if parent and parent not in self.members:
            self.add_dir(parent)

    def write(self, tarball: Path) -> str:
        """Write the plan as an uncompressed tarball in sorted order; return its SHA-256."""
        with tarfile.open(tarball, "w", format=tarfile.PAX_FORMAT) as archive:
            for name in sorted(self.members):
                member = self.members[name]
                info = tarfile.TarInfo(name)
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mode = member.mode
                info.mtime = 0
                if member.kind == "dir":
                    info.type = tarfile.DIRTYPE
                    archive.addfile(info)
                elif member.kind == "symlink":
                    info.type = tarfile.SYMTYPE
                    info.linkname = member.source
                    info.mode = 0o777
                    archive.addfile(info)
                elif member.kind == "data":
                    info.size = len(member.data)
                    archive.addfile(info, io.BytesIO(member.data))
                else:
                    stat = os.stat(member.source)
                    info.size = stat.st_size
                    # Keep file times: a .pyc records its source's mtime, and a changed
                    # one would make Python recompile (in memory, on a read-only root) every run.
                    info.mtime = int(stat.st_mtime)
                    with open(member.source, "rb") as handle:
                        archive.addfile(info, handle)
        digest = hashlib.sha256()
        with open(tarball, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()


# ---------------------------------------------------------------- shared libraries


_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)\s+\(0x[0-9a-f]+\)")
_LDD_LOADER = re.compile(r"^\s*(/\S+)\s+\(0x[0-9a-f]+\)")


def parse_ldd(text: str) -> tuple[dict[str, str], list[str]]:
    """``ldd`` output as ``({soname: path}, [loader paths])``; vDSO and missing libraries are skipped."""
    libraries: dict[str, str] = {}
    loaders: list[str] = []
    for line in text.splitlines():
        if match := _LDD_LINE.match(line):
            libraries[match.group(1)] = match.group(2)
        elif match := _LDD_LOADER.match(line):
            loaders.append(match.group(1))
    return libraries, loaders


def _ldd(paths: list[str]) -> tuple[dict[str, str], list[str]]:
    libraries: dict[str, str] = {}
    loaders: list[str] = []
    for path in paths:
        result = subprocess.run(["ldd", path], capture_output=True, text=True)
        found, found_loaders = parse_ldd(result.stdout)
        libraries.update(found)
        loaders.extend(found_loaders)
    return libraries, sorted(set(loaders))


def _system_dirs() -> tuple[str, ...]:
    return ("/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32")


# ---------------------------------------------------------------- python


def _python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _add_python(plan: RootfsPlan, progress: Callable[[str], None]) -> None:
    version = _python_version()
    prefix = Path(sys.base_prefix)
    binary = Path(os.path.realpath(prefix / "bin" / f"python{version}"))
    if not binary.is_file():
        binary = Path(os.path.realpath(sys._base_executable if hasattr(sys, "_base_executable") else sys.executable))
    stdlib = Path(os.path.realpath(os.path.dirname(os.__file__)))
    progress(f"python {version}: {binary} with its standard library {stdlib}")

    plan.add_host(str(binary), f"usr/local/bin/python{version}")
    plan.add_symlink("usr/local/bin/python3", f"python{version}")
    plan.add_symlink("usr/local/bin/python", f"python{version}")

    lib_root = f"usr/local/lib/python{version}"
    plan.add_dir(lib_root)
    for directory, subdirs, files in os.walk(stdlib):
        relative_dir = os.path.relpath(directory, stdlib)
        relative_dir = "" if relative_dir == "." else relative_dir
        kept = []
        for sub in sorted(subdirs):
            relative = f"{relative_dir}/{sub}".lstrip("/")
            if stdlib_excluded(relative, version):
                continue
            kept.append(sub)
            host = os.path.join(directory, sub)
            if os.path.islink(host):
                plan.add_host(host, f"{lib_root}/{relative}", follow=False)
            else:
                plan.add_dir(f"{lib_root}/{relative}", os.lstat(host).st_mode & 0o7777)
        subdirs[:] = [s for s in kept if not os.path.islink(os.path.join(directory, s))]
        for name in sorted(files):
            relative = f"{relative_dir}/{name}".lstrip("/")
            if not stdlib_excluded(relative, version):
                plan.add_host(os.path.join(directory, name), f"{lib_root}/{relative}", follow=False)
    plan.add_dir(f"{lib_root}/site-packages")
    site_source = stdlib / "site.py"
    if site_source.is_file() and "dist-packages" in site_source.read_text(errors="replace"):
        # Debian's patched site module looks in dist-packages, never site-packages.
        plan.add_symlink(f"{lib_root}/dist-packages", "site-packages")

    dynload = stdlib / "lib-dynload"
    multiarch = _add_libraries(plan, [str(binary), *sorted(str(p) for p in dynload.glob("*.so"))])
    own_lib = os.path.realpath(prefix / "lib")
    if not canonical_path(own_lib + "/x").startswith(_system_dirs()):
        for library in sorted(Path(own_lib).glob(f"libpython{version}*.so*")):
            plan.add_host(str(library), f"{multiarch}/{library.name}", follow=False)


def _add_libraries(plan: RootfsPlan, objects: list[str]) -> str:
    """The shared libraries ``ldd`` reports for ``objects`` and their loaders; returns the multiarch folder."""
    libraries, loaders = _ldd(objects)
    libc = libraries.get("libc.so.6")
    multiarch = os.path.dirname(canonical_path(os.path.realpath(libc))) if libc else "/usr/lib"
    for soname, path in sorted(libraries.items()):
        real = os.path.realpath(path)
        canonical_dir = os.path.dirname(canonical_path(real))
        if canonical_dir.startswith(_system_dirs()):
            plan.add_host(real)
            if os.path.basename(real) != soname:
                plan.add_symlink(f"{canonical_dir}/{soname}", os.path.basename(real))
        else:
            # The interpreter's own libraries (libpython) sit where its RUNPATH
            # points; in the image they go where the loader looks without one.
            plan.add_host(real, f"{multiarch}/{os.path.basename(real)}")
            if os.path.basename(real) != soname:
                plan.add_symlink(f"{multiarch}/{soname}", os.path.basename(real))
    for loader in loaders:
        plan.add_host(loader)
    return multiarch


def _requirement_closure(root: str) -> list[importlib.metadata.Distribution]:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, importlib.metadata.Distribution] = {}
    pending = [root]
    while pending:
        name = canonicalize_name(pending.pop())
        if name in seen:
            continue
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        seen[name] = distribution
        for text in distribution.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return [seen[n] for n in sorted(seen)]


def _add_pytest(plan: RootfsPlan, progress: Callable[[str], None]) -> str:
    _add_distribution(plan, "pytest", progress)
    return importlib.metadata.version("pytest")


def _add_distribution(plan: RootfsPlan, root: str, progress: Callable[[str], None]) -> None:
    """Copy an installed distribution and its requirement closure into the image's site-packages.

    Compiled objects and executables among their files (a C extension, Playwright's Node driver) get the
    shared libraries ``ldd`` reports for them.
    """
    site = f"usr/local/lib/python{_python_version()}/site-packages"
    distributions = _requirement_closure(root)
    if not distributions:
        raise SandboxError(f"{root} is not installed in the running environment: `pip install {root}`")
    progress(f"{root} and its dependencies: " + ", ".join(
        f"{d.metadata['Name']} {d.version}" for d in distributions))
    scripts: dict[str, str] = {}
    binaries: list[str] = []
    for distribution in distributions:
        for file in distribution.files or []:
            if ".." in file.parts:
                continue  # console scripts with a host shebang: written below
            host = str(distribution.locate_file(file))
            plan.add_host(host, f"{site}/{file.as_posix()}", follow=False)
            if os.path.isfile(host) and (host.endswith(".so") or os.access(host, os.X_OK) and _is_elf(host)):
                binaries.append(host)
        for entry in distribution.entry_points:
            if entry.group == "console_scripts":
                scripts[entry.name] = entry.value
    for name, value in sorted(scripts.items()):
        module, _, attribute = value.partition(":")
        script = (
            f"#!/usr/local/bin/python{_python_version()}\nimport sys\n"
            f"from {module} import {attribute.split('.')[0]}\n"
            f"sys.exit({attribute}())\n"
        )
        plan.add_data(f"usr/local/bin/{name}", script.encode(), 0o755)
    if binaries:
        _add_libraries(plan, binaries)


def _is_elf(path: str) -> bool:
    with open(path, "rb") as handle:
        return handle.read(4) == b"\x7fELF"


# ---------------------------------------------------------------- etc


def _alternatives(plan: RootfsPlan) -> None:
    """``/etc/alternatives`` links whose targets the image holds, and the links pointing at them."""
    admin = Path("/var/lib/dpkg/alternatives")
    if not admin.is_dir():
        return
    for record in sorted(admin.iterdir()):
        lines = record.read_text(errors="replace").splitlines()
        if len(lines) < 2:
            continue
        links = {record.name: lines[1]}
        for index in range(2, len(lines) - 1, 2):
            if not lines[index]:
                break
            links[lines[index]] = lines[index + 1]
        for name, link in links.items():
            choice = f"/etc/alternatives/{name}"
            if not os.path.islink(choice):
                continue
            target = canonical_path(os.path.realpath(choice))
            if target.strip("/") not in plan.members:
                continue
            plan.add_symlink(choice, os.readlink(choice))
            if os.path.islink(link) and os.readlink(link) == choice:
                plan.add_symlink(canonical_path(link), choice)


def _add_etc(plan: RootfsPlan) -> None:
    for path, data in etc_files().items():
        plan.add_data(path, data)
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf"):
        plan.add_host(path, path, follow=False)
    conf_dir = Path("/etc/ld.so.conf.d")
    if conf_dir.is_dir():
        plan.add_dir("etc/ld.so.conf.d")
        for conf in sorted(conf_dir.iterdir()):
            if conf.is_file():
                plan.add_host(str(conf), str(conf), follow=False)
    if os.path.exists("/etc/localtime"):
        # Dereferenced: the zoneinfo file it points at is not in the image.
        plan.add_host(os.path.realpath("/etc/localtime"), "etc/localtime", follow=False)
    _alternatives(plan)


# ---------------------------------------------------------------- build


def plan_rootfs(progress: Callable[[str], None] = lambda line: None, *, browser: bool = False
                ) -> tuple[RootfsPlan, list[str], str]:
    """Plan the image's root filesystem from this host: ``(plan, packages, pytest version)``.

    Args:
        progress: Called with one line per step.
        browser: Add Chromium, fonts and Playwright (the browser image).

    Raises:
        SandboxUnavailableError: This host has no ``dpkg`` (or, for the browser image, no Chromium).
    """
    packages = _dpkg_packages(BROWSER_PACKAGES if browser else ())
    progress(f"{len(packages)} Debian packages: {' '.join(packages)}")
    plan = RootfsPlan()
    for path in _dpkg_files(packages):
        canonical = canonical_path(path)
        if is_excluded(canonical) or os.path.isdir(path) and not os.path.islink(path):
            continue  # directories come with the files in them
        plan.add_host(path)
    for sh in ("/bin/sh", "/usr/bin/sh"):
        plan.add_host(sh)
    for name in MERGED_USR_LINKS:
        host = f"/{name}"
        if os.path.islink(host):
            target = os.readlink(host)
            if target.strip("/") in plan.members:
                plan.add_symlink(name, target)
    _add_python(plan, progress)
    pytest_version = _add_pytest(plan, progress)
    if browser:
        for root in BROWSER_DISTRIBUTIONS:
            _add_distribution(plan, root, progress)
        chromium = Path(BROWSER_CHROMIUM)
        if not chromium.is_file():
            raise SandboxUnavailableError(f"the browser image needs Debian's Chromium at {chromium}: "
                                          "`apt-get install chromium`")
        # What the packages declare should cover Chromium's libraries; ldd makes sure of it.
        _add_libraries(plan, [str(chromium), *sorted(str(p) for p in chromium.parent.glob("*.so"))])
    _add_etc(plan)
    for path, mode in EMPTY_DIRS.items():
        plan.add_dir(path, mode)
        plan.members[path].mode = mode
    return plan, packages, pytest_version


def _docker_client():  # noqa: ANN202 - the docker SDK is optional and imported lazily
    try:
        import docker
    except ImportError as exc:
        raise SandboxUnavailableError("the docker Python SDK is not installed: `pip install docker`") from exc
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the engine means the same to the user
        raise SandboxUnavailableError(f"no Docker engine answers here ({exc}); {_ENGINE_HINT}") from exc
    return client


def _changes(python_version: str, pytest_version: str, content_hash: str, browser: bool = False) -> list[str]:
    extra = [f'LABEL factory.browser="chromium {_package_version("chromium")}, '
             f'playwright {importlib.metadata.version("playwright")}"'] if browser else []
    return [*extra,
        f"ENV PATH={IMAGE_PATH}",
        "ENV LANG=C.UTF-8",
        "WORKDIR /workspace",
        f'LABEL factory.version="{__version__}"',
        f'LABEL factory.python="{python_version}"',
        f'LABEL factory.pytest="{pytest_version}"',
        f'LABEL factory.image.hash="sha256:{content_hash}"',
    ]


def _package_version(name: str) -> str:
    return _run(["dpkg-query", "-W", "-f", "${Version}", name]).strip()


#: The browser image's smoke test: Chromium headless, driven by Playwright, renders a page and runs its script.
_BROWSER_SMOKE = f"""
from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path={BROWSER_CHROMIUM!r}, args=["--no-sandbox", "--disable-gpu"])
    page = browser.new_page()
    page.set_content("<button onclick=\\"this.textContent = 6 * 7\\">go</button>")
    page.click("button")
    print("chromium", browser.version, "clicked:", page.inner_text("button"), "png bytes:", len(page.screenshot()))
    browser.close()
"""


def _smoke_test(client, tag: str, progress: Callable[[str], None], browser: bool = False) -> None:  # noqa: ANN001
    commands = [
        ["python", "-c", "import pytest, sys; print(sys.version)"],
        ["sh", "-c", 'awk "BEGIN{print 1}"; id -un'],
    ]
    if browser:
        commands.append(["python", "-c", _BROWSER_SMOKE])
    for command in commands:
        container = client.containers.create(
            tag, command, network_mode="none", read_only=True, user="65534:65534",
            tmpfs={"/tmp": "size=256m,mode=1777"}, environment={"HOME": "/tmp"},
        )
        try:
            container.start()
            status = container.wait(timeout=120)
            output = container.logs(stdout=True, stderr=True).decode(errors="replace").strip()
        finally:
            container.remove(force=True)
        if status.get("StatusCode") != 0:
            raise SandboxError(
                f"image {tag} failed its smoke test: {' '.join(command)} exited "
                f"{status.get('StatusCode')}: {output[-2000:]}"
            )
        progress(f"smoke test: {' '.join(command)[:80]} -> {' | '.join(output.splitlines())}")


def build_image(tag: str | None = None, *, progress: Callable[[str], None] | None = None,
                browser: bool = False) -> ImageBuild:
    """Build the docker sandbox's image from this host, offline, and smoke-test it.

    Args:
        tag: The image tag; :func:`default_image_tag` (:func:`browser_image_tag` with ``browser``) if None.
        progress: Called with one line per step (for a CLI's stderr).
        browser: Build the browser image: the default image plus Chromium, fonts and Playwright.

    Returns:
        What was built.

    Raises:
        SandboxUnavailableError: No Docker engine answers, or this host has no ``dpkg`` (or no Chromium).
        SandboxError: The import failed, or the image failed its smoke test.
    """
    report = progress or (lambda line: None)
    tag = tag or (browser_image_tag() if browser else default_image_tag())
    started = time.monotonic()
    client = _docker_client()
    plan, packages, pytest_version = plan_rootfs(report, browser=browser)
    python_version = ".".join(str(part) for part in sys.version_info[:3])
    workdir = Path(tempfile.mkdtemp(prefix="factory-image-", dir=tempfile.gettempdir()))
    try:
        tarball = workdir / "rootfs.tar"
        report(f"writing {len(plan.members)} entries to {tarball}")
        content_hash = plan.write(tarball)
        report(f"rootfs {tarball.stat().st_size / 1e6:.1f} MB, sha256:{content_hash[:16]}; importing as {tag}")
        repository, _, version = tag.rpartition(":") if ":" in tag.split("/")[-1] else (tag, "", "latest")
        if _labels_of(client, tag).get("factory.image.hash") == f"sha256:{content_hash}":
            report(f"{tag} already holds this content: import skipped")
            return _finish(client, tag, report, started, packages, pytest_version, content_hash, browser)
        try:
            answer = client.api.import_image(
                src=str(tarball), repository=repository, tag=version,
                changes=_changes(python_version, pytest_version, content_hash, browser),
            )
        except Exception as exc:  # noqa: BLE001 - the SDK's errors, translated at the boundary
            raise SandboxError(f"docker import of {tag} failed: {exc}") from exc
        if "error" in str(answer).lower() and "sha256:" not in str(answer):
            raise SandboxError(f"docker import of {tag} failed: {answer}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return _finish(client, tag, report, started, packages, pytest_version, content_hash, browser)


def _labels_of(client, tag: str) -> dict[str, str]:  # noqa: ANN001
    import docker.errors

    try:
        return dict(client.images.get(tag).labels or {})
    except docker.errors.ImageNotFound:
        return {}


def _finish(  # noqa: PLR0913 - the build's facts, gathered in one place
    client, tag: str, report: Callable[[str], None], started: float,  # noqa: ANN001
    packages: list[str], pytest_version: str, content_hash: str, browser: bool = False,
) -> ImageBuild:
    image = client.images.get(tag)
    _smoke_test(client, tag, report, browser)
    return ImageBuild(
        tag=tag,
        image_id=image.id,
        size_bytes=int(image.attrs.get("Size") or 0),
        python_version=".".join(str(part) for part in sys.version_info[:3]),
        pytest_version=pytest_version,
        seconds=round(time.monotonic() - started, 1),
        packages=tuple(packages),
        content_hash=f"sha256:{content_hash}",
    )
