"""The sandboxes' seccomp filter: classic BPF for bwrap, a profile for docker.

``bwrap --seccomp FD`` loads a ready-made program (an array of ``struct
sock_filter``); building it here needs neither libseccomp nor its Python
bindings. The program:

1. checks the architecture of the call: the native x86_64 or aarch64 ABI
   goes on; any other (i386 through ``int 0x80``, say, whose numbers differ)
   is refused outright, so no second syscall table slips past the list;
2. refuses x86_64's x32 ABI (numbers with bit 30 set), for the same reason;
3. refuses with ``EPERM`` the calls a workload never needs and an escape
   does: kernel and namespace administration (``mount``, ``unshare``,
   ``setns``, ``pivot_root``, module and kexec loading), debugging and
   introspection of other processes (``ptrace``, ``perf_event_open``,
   ``bpf``), the kernel keyring, raw port I/O, ``open_by_handle_at`` (the
   classic container escape), ``userfaultfd`` and io_uring (both favourite
   tools of kernel exploits);
4. refuses ``clone`` with any namespace flag, and answers ``clone3`` with
   ``ENOSYS`` (its flags live in memory a filter cannot read; libc then falls
   back to ``clone``, which is checked), so no user namespace is ever made;
5. with ``no_symlinks``, refuses ``symlink`` and ``symlinkat`` too (the
   solution sandbox of an isolated verification: links it would plant in
   the scratch area it shares with the trusted sandbox, where non-Python
   tools such as ``diff`` follow them);
6. allows everything else.

:func:`docker_seccomp_profile` states the same rules as a Docker seccomp
profile (``--security-opt seccomp=...``): the engine compiles it with
libseccomp, which also refuses every ABI but the native one.
"""

from __future__ import annotations

import errno
import json
import platform
import struct

from factory.errors import SandboxUnavailableError

__all__ = ["BLOCKED_SYSCALLS", "SYMLINK_SYSCALLS", "docker_seccomp_profile", "seccomp_program", "syscall_numbers"]

# Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000

# Offsets in struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6].
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # little-endian: the low half of args[0] comes first

_X32_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

#: Refused with EPERM, by name (numbers per architecture below).
BLOCKED_SYSCALLS: tuple[str, ...] = (
    "ptrace", "process_vm_readv", "process_vm_writev", "perf_event_open", "bpf",
    "mount", "umount2", "pivot_root", "unshare", "setns",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "keyctl", "add_key", "request_key",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "iopl", "ioperm", "open_by_handle_at", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)
#: Refused with EPERM as well where a sandbox may create no symbolic link (``no_symlinks``).
SYMLINK_SYSCALLS: tuple[str, ...] = ("symlink", "symlinkat")

# Numbers from the kernel's syscall tables (arch/x86/entry/syscalls/syscall_64.tbl,
# include/uapi/asm-generic/unistd.h for aarch64). The calls from 424 on share
# their numbers across architectures.
_COMMON = {"open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
           "mount_setattr": 442, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
           "clone3": 435}
_TABLES: dict[str, tuple[int, dict[str, int]]] = {
    # machine: (AUDIT_ARCH_*, numbers)
    "x86_64": (0xC000003E, {
        **_COMMON, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "perf_event_open": 298,
        "bpf": 321, "mount": 165, "umount2": 166, "pivot_root": 155, "unshare": 272, "setns": 308,
        "keyctl": 250, "add_key": 248, "request_key": 249, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "iopl": 172, "ioperm": 173,
        "open_by_handle_at": 304, "userfaultfd": 323, "clone": 56, "symlink": 88, "symlinkat": 266}),
    "aarch64": (0xC00000B7, {
        **_COMMON, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "perf_event_open": 241,
        "bpf": 280, "mount": 40, "umount2": 39, "pivot_root": 41, "unshare": 97, "setns": 268,
        "keyctl": 219, "add_key": 217, "request_key": 218, "kexec_load": 104, "kexec_file_load": 294,
        "init_module": 105, "finit_module": 273, "delete_module": 106,
        "open_by_handle_at": 265, "userfaultfd": 282, "clone": 220, "symlinkat": 36}),  # no iopl/ioperm, symlink
}
_MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}


def syscall_numbers() -> dict[str, dict[str, int]]:
    """The numbers of :data:`BLOCKED_SYSCALLS`, :data:`SYMLINK_SYSCALLS`, ``clone`` and ``clone3`` on each known
    machine."""
    return {machine: dict(numbers) for machine, (_, numbers) in _TABLES.items()}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _blocked(machine: str, no_symlinks: bool) -> list[str]:
    names = BLOCKED_SYSCALLS + (SYMLINK_SYSCALLS if no_symlinks else ())
    return [name for name in names if name in _TABLES[machine][1]]


def seccomp_program(machine: str | None = None, *, no_symlinks: bool = False) -> bytes:
    """The filter for ``machine`` (default: this one's), as ``bwrap --seccomp`` reads it.

    Args:
        machine: The architecture (``x86_64``, ``aarch64``).
        no_symlinks: Refuse :data:`SYMLINK_SYSCALLS` too.

    Raises:
        SandboxUnavailableError: No syscall table for this architecture.
    """
    machine = (machine or platform.machine()).lower()
    machine = _MACHINES.get(machine, machine)
    if machine not in _TABLES:
        raise SandboxUnavailableError(
            f"the bwrap sandbox's syscall filter knows x86_64 and aarch64, not {machine}")
    arch, numbers = _TABLES[machine]
    blocked = sorted({numbers[name] for name in _blocked(machine, no_symlinks)})
    deny = _RET_ERRNO | errno.EPERM
    # Laid out so that every jump goes forward to one of the shared endings:
    #   arch check, [x32 check], one JEQ per blocked call, clone3, clone -> flag check, allow
    body: list[tuple[str, int, str | None, str | None]] = []  # (op, k, jump-if-true label, jump-if-false label)
    body.append(("ld", _ARCH, None, None))
    body.append(("jeq", arch, None, "deny"))
    body.append(("ld", _NR, None, None))
    if machine == "x86_64":
        body.append(("jge", _X32_BIT, "deny", None))
    for number in blocked:
        body.append(("jeq", number, "deny", None))
    body.append(("jeq", numbers["clone3"], "nosys", None))
    body.append(("jeq", numbers["clone"], None, "allow"))
    body.append(("ld", _ARG0_LOW, None, None))
    body.append(("jset", _CLONE_NAMESPACES, "deny", "allow"))
    endings = {"allow": _RET_ALLOW, "deny": deny, "nosys": _RET_ERRNO | errno.ENOSYS}
    where = {label: len(body) + i for i, label in enumerate(endings)}
    program = []
    for index, (op, k, if_true, if_false) in enumerate(body):
        if op == "ld":
            program.append(_insn(_LD_W_ABS, k))
            continue
        jt = where[if_true] - index - 1 if if_true else 0
        jf = where[if_false] - index - 1 if if_false else 0
        if max(jt, jf) > 255:
            raise AssertionError("seccomp program too long for 8-bit jumps")
        program.append(_insn({"jeq": _JEQ_K, "jge": _JGE_K, "jset": _JSET_K}[op], k, jt, jf))
    program += [_insn(_RET_K, value) for value in endings.values()]
    return b"".join(program)


def docker_seccomp_profile(machine: str | None = None, *, no_symlinks: bool = False) -> str:
    """The filter's rules as a Docker seccomp profile (JSON), for ``machine`` (default: this one's).

    Calls are named, not numbered (the engine resolves them); ``clone`` is
    refused when any namespace flag is set, one rule per flag, since a profile
    compares masked values for equality only.

    Args:
        machine: The architecture (``x86_64``, ``aarch64``).
        no_symlinks: Refuse :data:`SYMLINK_SYSCALLS` too.

    Raises:
        SandboxUnavailableError: For an architecture the filter does not know.
    """
    machine = (machine or platform.machine()).lower()
    machine = _MACHINES.get(machine, machine)
    if machine not in _TABLES:
        raise SandboxUnavailableError(f"the sandboxes' syscall filter knows x86_64 and aarch64, not {machine}")
    names = sorted(_blocked(machine, no_symlinks))
    rules: list[dict[str, object]] = [{"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}]
    rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    for bit in range(32):
        flag = 1 << bit
        if _CLONE_NAMESPACES & flag:
            rules.append({"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM,
                          "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}]})
    architecture = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}[machine]
    return json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "architectures": [architecture], "syscalls": rules})
