"""The grader's clean copy (``autograders.worker.zygote``) for the test suite, as a Python of its own.

A pytest worker runs threads, so it cannot fork the copy as the runner does (``zygote.start``). It
starts one as ``python tests/clean_copy.py READ_FD WRITE_FD``, which imports what the runner imports
before its snapshot and serves (``zygote.serve``), and sends its launches there (``zygote.relay``):
multi-process answers judged in-process launch exactly as in grading. Used by conftest's
``forked_launches`` fixture.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY_SECONDS = 120  # importing torch, Lightning and the course in the copy


def start() -> subprocess.Popen | None:
    """Start the copy and connect this process's launches to it; None (with the reason on stderr) if it
    cannot serve, and launches then start torchrun, slower but the same."""
    from autograders.worker import zygote
    from autograders.worker.forking import Channel

    requests_r, requests_w = os.pipe()
    responses_r, responses_w = os.pipe()
    # one thread, as in the sandbox (its environment sets OMP_NUM_THREADS=1): forking needs it
    process = subprocess.Popen([sys.executable, __file__, str(requests_r), str(responses_w)],
                               pass_fds=(requests_r, responses_w), cwd=ROOT,
                               env={**os.environ, "OMP_NUM_THREADS": "1",
                                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    os.close(requests_r)
    os.close(responses_w)
    responses = Channel(read=responses_r)
    try:
        ready = responses.receive(READY_SECONDS)
    except EOFError:  # it could not start
        ready = None
    if not ready or not ready.get("ready"):
        print(f"the clean copy is not serving: {(ready or {}).get('why') or 'it did not start'}", file=sys.stderr)
        process.kill()
        process.wait()
        os.close(requests_w)
        os.close(responses_r)
        return None
    zygote.relay(Channel(write=requests_w), responses)
    process.channels = (requests_w, responses_r)
    return process


def stop(process: subprocess.Popen) -> None:
    """End the copy: closing its requests ends its loop; then it is waited for."""
    requests_w, responses_r = process.channels
    os.close(requests_w)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    os.close(responses_r)


def _serve(read_fd: int, write_fd: int) -> None:
    """The copy: import what the runner imports before its snapshot, then serve (or say why not)."""
    from autograders.worker import zygote
    from autograders.worker.forking import Channel, fork_safe
    from autograders.worker.trust import import_course

    import_course()
    outgoing = Channel(write=write_fd)
    why = fork_safe()
    outgoing.send({"ready": why is None, "why": why or ""})
    if why is None:
        zygote.serve(Channel(read=read_fd), outgoing)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _serve(int(sys.argv[1]), int(sys.argv[2]))
