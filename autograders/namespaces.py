"""The ``namespaces`` isolation (the grader is root): new namespaces, the sandbox's root, its user; one
way, in Python, for every isolated run as root.

    isolate(script, processes, user)      in a child of the preloaded Python (autograders/preload.py)
    python -m autograders.namespaces SETTINGS -- COMMAND...
                                          a run that starts its program (sandbox_view._isolated_command):
                                          the same steps, then COMMAND in place of this process

The steps are what ``unshare --net --mount --pid --ipc --fork --kill-child``, ``ip link set lo up``, the
mount script (``sandbox_view._mount_script``, which mounts the PID namespace's own /proc), ``chroot`` and
``setpriv --reuid=USER --regid=USER --clear-groups --no-new-privs --inh-caps=-all`` with
``prlimit --nproc`` do, made as system calls: a forked child of the preloaded Python has no command line
to put them on, and a run that starts its program goes through the same code, not a second copy of it
in shell commands. Bubblewrap (any user, ``sandbox_view._bwrap_command``) is the other method; it
confines a program it starts itself.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys

from .sandbox_view import NOBODY, ROOT_MOUNT

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1  # <linux/sockios.h>, <net/if.h>
IFREQ = "16sh22x"  # struct ifreq on 64-bit Linux: the name, then ifr_flags at the start of a 24-byte union


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _loopback_up() -> None:
    """What ``ip link set lo up`` does, as the ioctl it makes: the new network namespace has only a
    loopback interface, down; up, the code can use 127.0.0.1 among its own processes (gloo needs it),
    and nothing outside the namespace is reachable. No iproute2 needed on the grading machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        _, flags = struct.unpack(IFREQ, fcntl.ioctl(sock, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))


def _drop_privileges(processes: int, user: int = NOBODY) -> None:
    """What ``setpriv --reuid=USER --regid=USER --clear-groups --no-new-privs --inh-caps=-all``
    and ``prlimit --nproc`` do (USER: nobody, or another free uid, sandbox.Limits.user); refuses to go
    on if any capability is left."""
    libc = _libc()
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    os.setgroups([])
    os.setresgid(user, user, user)
    os.setresuid(user, user, user)
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable, twice: all empty
    _check(libc.capset(header, data), "capset")
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    left = [k for k in ("CapInh", "CapPrm", "CapEff", "CapAmb") if int(status.get(k, "0").strip(), 16)]
    if left or os.getuid() != user or os.getgid() != user or os.getgroups():
        raise SystemExit(f"sandbox: privileges not dropped ({', '.join(left) or 'ids'})")
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def isolate(script: str, processes: int, user: int = NOBODY) -> None:
    """New namespaces; the child of this process becomes PID 1 of the new PID namespace and returns,
    as ``nobody`` in /mnt; this process waits for it and exits as it did (``unshare --fork --kill-child``)."""
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC), "unshare")
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code & 0xFF)
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    _loopback_up()
    mounts = subprocess.run(["sh", "-c", script], stdin=subprocess.DEVNULL)  # output: the sandbox's own
    if mounts.returncode != 0:
        os._exit(mounts.returncode & 0xFF or 1)
    os.chroot(ROOT_MOUNT)  # the root the script put together: only what sandbox_view.visible() lists
    os.chdir("/mnt")
    _drop_privileges(processes, user)
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # a change of user clears it


def main(argv: list[str]) -> None:
    """``python -m autograders.namespaces SETTINGS -- COMMAND...``: SETTINGS is ``{"script", "processes",
    "user"}`` as JSON. Started by ``sandbox.run`` with the grader's folder as its working folder (never the
    run's: ``-m`` looks there first), the run's scrubbed environment and limits; COMMAND is looked up on
    that environment's PATH."""
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit("usage: python -m autograders.namespaces SETTINGS -- COMMAND...")
    settings = json.loads(argv[0])
    isolate(settings["script"], int(settings["processes"]), int(settings["user"]))
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
