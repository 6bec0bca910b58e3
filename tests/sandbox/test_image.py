"""The docker sandbox's default image, built offline from this host.

The pure parts (which Debian packages, which paths, which /etc) are checked
on small fakes; where dpkg is here the real root filesystem plan is checked;
where a Docker engine answers, one real image is built, run with no network,
and removed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from factory.sandbox import ImageBuild, browser_image_tag, build_image, default_image_tag, docker_available
from factory.sandbox._image import (
    canonical_path,
    etc_files,
    is_excluded,
    package_closure,
    parse_dpkg_status,
    parse_ldd,
    plan_rootfs,
    stdlib_excluded,
)

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
TEST_TAG = "factory-sandbox-test:build"


def status_line(name, *, arch="amd64", status="ii ", depends="", pre="", provides="", qualified=None):
    return "\t".join([name, qualified or name, arch, status, depends, pre, provides])


FAKE_STATUS = "\n".join([
    status_line("bash", depends="base-files (>= 2.1.12), debianutils (>= 5.6-0.1)",
                pre="libc6 (>= 2.36), libtinfo6 (>= 6)"),
    status_line("base-files", arch="all"),
    status_line("debianutils"),
    status_line("libc6", qualified="libc6:amd64", depends="libgcc-s1"),
    status_line("libc6", arch="i386", qualified="libc6:i386", depends="i386-only"),
    status_line("libgcc-s1", qualified="libgcc-s1:amd64"),
    status_line("libtinfo6", qualified="libtinfo6:amd64", pre="libc6:any (>= 2.34)"),
    status_line("mawk", provides="awk", depends="libc6 (>= 2.29)"),
    status_line("gawk", status="rc ", provides="awk", depends="libmpfr6"),
    status_line("grep", depends="gawk | sed (>= 4) | busybox, dpkg (>= 1.15.4) | install-info"),
    status_line("sed", depends="libacl1"),
    status_line("libacl1", qualified="libacl1:amd64"),
    status_line("dpkg"),
    status_line("unrelated", depends="libc6"),
    "truncated line without tabs",
])


def test_default_image_tag_names_this_python():
    assert default_image_tag() == f"factory-sandbox:py{VERSION}"


def test_dpkg_status_keeps_installed_native_packages_with_their_relations():
    installed = parse_dpkg_status(FAKE_STATUS)
    assert "gawk" not in installed  # removed, config files only
    assert installed["libc6"].qualified == "libc6:amd64"  # the native one, not i386
    assert installed["bash"].depends == (("base-files",), ("debianutils",), ("libc6",), ("libtinfo6",))
    assert installed["grep"].depends == (("gawk", "sed", "busybox"), ("dpkg", "install-info"))
    assert installed["mawk"].provides == ("awk",)


def test_package_closure_follows_depends_alternatives_and_virtual_packages():
    closure = package_closure(parse_dpkg_status(FAKE_STATUS), ["bash", "awk", "grep", "procps"])
    assert closure == sorted([
        "bash", "base-files", "debianutils", "libc6:amd64", "libgcc-s1:amd64", "libtinfo6:amd64",
        "mawk",  # provides awk
        "grep", "sed", "libacl1:amd64",  # gawk is not installed: the next alternative, sed
        "dpkg",
    ])  # procps is not installed: skipped; "unrelated" is nobody's dependency


def test_package_closure_leaves_out_omitted_packages_and_what_only_they_need():
    installed = parse_dpkg_status(FAKE_STATUS)
    closure = package_closure(installed, ["bash", "grep"], omit=["sed", "debianutils"])
    assert "sed" not in closure and "libacl1:amd64" not in closure  # libacl1 came only through sed
    assert "debianutils" not in closure and "libc6:amd64" in closure  # libc6 is bash's own dependency too


def test_browser_image_tag_is_its_own():
    assert browser_image_tag() == f"factory-sandbox-browser:py{VERSION}" != default_image_tag()


@pytest.fixture
def merged_usr(tmp_path: Path) -> Path:
    """A root laid out like Debian 12's: /bin, /lib, /lib64, /sbin are links into usr/."""
    for name in ("bin", "lib", "lib64", "sbin"):
        (tmp_path / "usr" / name).mkdir(parents=True)
        (tmp_path / name).symlink_to(f"usr/{name}")
    (tmp_path / "usr/bin/dash").write_text("")
    (tmp_path / "usr/bin/sh").symlink_to("dash")
    (tmp_path / "usr/lib/x86_64-linux-gnu").mkdir()
    (tmp_path / "usr/lib64/ld-linux-x86-64.so.2").symlink_to("../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
    return tmp_path


def test_canonical_path_resolves_directory_links_but_keeps_the_last_component(merged_usr):
    assert canonical_path("/bin/dash", str(merged_usr)) == "/usr/bin/dash"
    assert canonical_path("/bin/sh", str(merged_usr)) == "/usr/bin/sh"  # a symlink itself: kept as one
    assert canonical_path("/lib64/ld-linux-x86-64.so.2", str(merged_usr)) == "/usr/lib64/ld-linux-x86-64.so.2"
    assert canonical_path("/lib/x86_64-linux-gnu", str(merged_usr)) == "/usr/lib/x86_64-linux-gnu"
    assert canonical_path("/bin", str(merged_usr)) == "/bin"
    assert canonical_path("/usr/bin/dash", str(merged_usr)) == "/usr/bin/dash"


def test_documentation_and_unneeded_stdlib_parts_are_left_out():
    assert is_excluded("/usr/share/doc/bash/copyright")
    assert is_excluded("/usr/share/man")
    assert is_excluded("/usr/share/locale/de/LC_MESSAGES/grep.mo")
    assert not is_excluded("/usr/share/docs-not-really")
    assert not is_excluded("/usr/bin/bash")
    for part in ("test/test_os.py", "site-packages/x.py", "idlelib", "tkinter/__init__.py",
                 "turtledemo", "ensurepip/__init__.py", f"config-{VERSION}-x86_64-linux-gnu/Makefile"):
        assert stdlib_excluded(part, VERSION), part
    for part in ("os.py", "__pycache__/os.cpython-311.pyc", "unittest/case.py", "lib-dynload/_ssl.so",
                 "json/tests.py"):
        assert not stdlib_excluded(part, VERSION), part


def test_etc_is_generated_not_the_hosts():
    files = etc_files()
    passwd = files["etc/passwd"].decode()
    assert passwd.splitlines() == [
        "root:x:0:0:root:/root:/bin/sh",
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin",
    ]
    if os.path.exists("/etc/passwd"):
        assert files["etc/passwd"] != Path("/etc/passwd").read_bytes()
    assert "nogroup:x:65534:" in files["etc/group"].decode()
    assert "etc/shadow" not in files
    assert all(line.split(":")[1].split() == ["files"] for line in files["etc/nsswitch.conf"].decode().splitlines())


def test_ldd_output_is_parsed_to_sonames_and_the_loader():
    text = (
        "\tlinux-vdso.so.1 (0x00007ffd)\n"
        "\tlibpython3.11.so.1.0 => /opt/py/lib/libpython3.11.so.1.0 (0x00007f10)\n"
        "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f20)\n"
        "\tlibgone.so.1 => not found\n"
        "\t/lib64/ld-linux-x86-64.so.2 (0x00007f30)\n"
    )
    libraries, loaders = parse_ldd(text)
    assert libraries == {
        "libpython3.11.so.1.0": "/opt/py/lib/libpython3.11.so.1.0",
        "libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6",
    }
    assert loaders == ["/lib64/ld-linux-x86-64.so.2"]


needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="no dpkg here: not a Debian-like host")


@pytest.fixture(scope="module")
def host_plan():
    return plan_rootfs()


@needs_dpkg
def test_rootfs_plan_of_this_host(host_plan):
    plan, packages, pytest_version = host_plan
    members = plan.members
    assert any(p.startswith("libc6") for p in packages) and "bash" in packages
    # Merged /usr: top-level links stay links and nothing is planned beneath them.
    for name in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{name}"):
            assert members[name].kind == "symlink"
            assert not any(m.startswith(name + "/") for m in members), name
    assert not any(is_excluded("/" + m) for m in members)
    assert members["etc/passwd"].data == etc_files()["etc/passwd"]
    assert "etc/shadow" not in members
    assert members["usr/bin/sh"].kind == "symlink"
    assert members["usr/bin/awk"].source == "/etc/alternatives/awk"
    assert members["etc/alternatives/awk"].kind == "symlink"
    assert members[f"usr/local/bin/python{VERSION}"].kind == "file"
    assert members["usr/local/bin/python"].source == f"python{VERSION}"
    site = f"usr/local/lib/python{VERSION}/site-packages"
    assert f"{site}/pytest/__init__.py" in members and f"{site}/pluggy/__init__.py" in members
    assert any(m.startswith(f"{site}/pytest-{pytest_version}.dist-info/") for m in members)
    assert f"usr/local/lib/python{VERSION}/os.py" in members
    assert not any(m.startswith(f"usr/local/lib/python{VERSION}/test/") for m in members)
    assert members["root"].mode == 0o700 and members["tmp"].mode == 0o1777 and members["var/tmp"].mode == 0o1777
    assert members["workspace"].kind == "dir"


@needs_dpkg
def test_rootfs_tarball_is_deterministic(host_plan, tmp_path):
    plan = host_plan[0]
    assert plan.write(tmp_path / "a.tar") == plan.write(tmp_path / "b.tar")


DOCKER_OK, DOCKER_WHY = docker_available()


@pytest.mark.skipif(not DOCKER_OK, reason=f"no Docker engine: {DOCKER_WHY}")
def test_built_image_runs_python_and_pytest_without_network(tmp_path):
    import docker

    client = docker.from_env()
    lines: list[str] = []
    build = build_image(TEST_TAG, progress=lines.append)
    try:
        assert isinstance(build, ImageBuild) and build.tag == TEST_TAG
        assert build.python_version == ".".join(map(str, sys.version_info[:3]))
        image = client.images.get(TEST_TAG)
        assert image.id == build.image_id
        assert image.labels["factory.image.hash"] == build.content_hash
        assert image.labels["factory.python"] == build.python_version
        assert any("smoke test" in line for line in lines)
        (tmp_path / "test_sum.py").write_text("def test_sum():\n    assert sum([1, 2]) == 3\n")
        tmp_path.chmod(0o777)
        output = client.containers.run(
            TEST_TAG,
            ["sh", "-c", "python -m pytest -q -p no:cacheprovider test_sum.py && "
                         "python -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=2)'"],
            network_mode="none", read_only=True, user="65534:65534", detach=True, tmpfs={"/tmp": ""},
            volumes={str(tmp_path): {"bind": "/workspace", "mode": "ro"}},
        )
        try:
            status = output.wait(timeout=60)
            logs = output.logs().decode()
        finally:
            output.remove(force=True)
        assert "1 passed" in logs
        assert status["StatusCode"] != 0 and "Network is unreachable" in logs, logs
    finally:
        client.images.remove(TEST_TAG, force=True)


def test_cli_build_image_help(cli):
    result = cli("sandbox", "build-image", "--help")
    assert result.exit_code == 0
    assert "--tag" in result.output and "offline" in result.output and "--browser" in result.output


def test_cli_check_none_backend(cli):
    result = cli("sandbox", "check", "none", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    statuses = {check["name"]: check["status"] for check in report["checks"]}
    assert report["backend"] == "none"
    assert statuses["no_network"] == "skipped"  # none claims no isolation
    assert "failed" not in statuses.values()
