"""The sandbox's fork servers: one loop (``serve``), whether forking is safe, a child's way out, JSON-line pipes.

Two processes serve forks: the preloaded Python (``autograders.preload``: one sandboxed run per
request, over a SOCK_SEQPACKET socket that also carries the run's descriptors) and the runner's clean
copy (``zygote``: one multi-process launch per request, over two pipes of JSON lines). Both run
``serve``: receive a request, fork a child that runs it, name the child, wait for it, say how it
ended. What happens around the fork is the request's own (a ``Fork``): a preload child renumbers the
descriptors it received (parked high, everything below closed, then each put at its target) and the
server names it only once it has its own session; a zygote child closes the server's ends by name,
keeping stdout and the ranks' report pipes, and the server reads those pipes while it waits. Also
here: ``fork_safe`` (one thread, no CUDA, Linux), ``in_child`` (a forked child never returns into the
server's code) and ``Channel``.
"""

from __future__ import annotations

import gc
import json
import os
import select
import sys
import time
import traceback
from typing import Callable, Protocol

from .job import DEFAULTS


class Fork(Protocol):
    """One request of a fork server, from the fork on (``serve``)."""

    def child(self) -> int | None:
        """In the forked child: run the request; the child's exit code (``in_child`` exits with it)."""

    def forked(self, pid: int) -> dict:
        """In the server, right after the fork: what the server gives up to the child; the reply naming it."""

    def finished(self, pid: int) -> dict:
        """In the server: wait for the child ``pid`` to end; the reply saying how it ended."""


def serve(receive: Callable[[], "Fork | None"], reply: Callable[[dict], None], failure_code: int = 1) -> None:
    """The fork loop of both servers, one request at a time until ``receive`` returns None (the other
    end is gone): fork a child that runs the request and exits (with ``failure_code`` if it raised),
    then ``reply`` with the message naming the child, and with the one saying how it ended.

    First, what the server has loaded (torch, Lightning, the course) leaves the garbage collector's
    generations (``gc.freeze``): a child's collections then never scan those objects again, nor write
    to the pages they lie on, which a fork shares with the server until it is written (copy-on-write)."""
    gc.collect()
    gc.freeze()
    while True:
        fork = receive()
        if fork is None:
            return
        pid = os.fork()
        if pid == 0:
            in_child(fork.child, code=failure_code)
        reply(fork.forked(pid))
        reply(fork.finished(pid))


def fork_safe() -> str | None:
    """Why forking this process is unsafe, or None when it is safe: a fork copies only the thread that
    calls it (a lock another thread held stays locked in the child forever), and a CUDA context does
    not survive a fork; /proc/self/task, which counts the threads, needs Linux."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        return "forking a preloaded Python needs Linux"
    if threads != 1:
        return f"{threads} threads (forking would copy none of them)"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialized"
    return None


def in_child(run, code: int = 1) -> None:
    """In a forked child: ``run()``, then exit with its exit code (``code`` when it raised, after the
    traceback), never returning into the server's loop and never running its atexit hooks."""
    try:
        result = run()
        code = result if isinstance(result, int) else code
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


MESSAGE_LIMIT = DEFAULTS.message_bytes  # bytes of one JSON line on a channel (the job's message_bytes)


class Channel:
    """JSON lines one way over a pipe: ``send`` on a write end, ``receive`` on a read end."""

    def __init__(self, read: int | None = None, write: int | None = None):
        self.read_fd, self.write_fd, self.buffer = read, write, bytearray()

    def send(self, message: dict) -> None:
        data = memoryview((json.dumps(message) + "\n").encode())
        while data:
            data = data[os.write(self.write_fd, data):]

    def complete(self) -> bool:
        return b"\n" in self.buffer

    def fill(self) -> bool:
        """Read what is there (once); False at end of file."""
        chunk = os.read(self.read_fd, 1 << 16)
        if not chunk:
            return False
        self.buffer += chunk
        if len(self.buffer) > MESSAGE_LIMIT and not self.complete():
            raise ValueError(f"a message longer than {MESSAGE_LIMIT} bytes")
        return True

    def take(self) -> dict:
        at = self.buffer.index(b"\n")
        line = bytes(self.buffer[:at])
        del self.buffer[:at + 1]
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError("a message that is not a JSON object")
        return message

    def receive(self, timeout: float | None = None) -> dict | None:
        """The next message; None when ``timeout`` seconds pass first; EOFError at end of file."""
        found = wait([self], timeout)
        if found is None:
            return None
        if found[1] is None:
            raise EOFError("the other end is closed")
        return found[1]


def wait(channels: list[Channel], timeout: float | None):
    """(channel, its next message) from the first of ``channels`` to have one, (channel, None) at its
    end of file, or None when ``timeout`` seconds pass first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        for channel in channels:
            if channel.complete():
                return channel, channel.take()
        left = None if deadline is None else max(deadline - time.monotonic(), 0)
        ready = select.select([c.read_fd for c in channels], [], [], left)[0]
        if not ready:
            return None
        for channel in channels:
            if channel.read_fd in ready and not channel.fill():
                return channel, None
