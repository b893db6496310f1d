"""Start `make lab` or `make formgrader` on a free port for a test, and stop it (and its kernels) after."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest

from conftest import ROOT

TOKEN = "gpucourse-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    """(status, body) of a GET, errors included."""
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@dataclass
class Server:
    base: str
    lines: list[str] = field(default_factory=list)  # what make and the server printed so far

    def url(self, path: str) -> str:
        return f"{self.base}{path}{'&' if '?' in path else '?'}token={TOKEN}"

    def get(self, path: str) -> tuple[int, str]:
        return get(self.url(path))

    @property
    def output(self) -> str:
        return "".join(self.lines)


@contextlib.contextmanager
def serve(target: str, timeout: float = 300, **make_vars: object):
    """``make <target>`` with the test's port and token; yields a Server once it answers."""
    port = _free_port()
    args = f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={TOKEN} --ServerApp.port_retries=0"
    command = ["make", "-s", target, f"LAB_ARGS={args}"] + [f"{k}={v}" for k, v in make_vars.items()]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}")
    reader = threading.Thread(target=lambda: server.lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout  # `make formgrader` registers the course first
        while True:
            if proc.poll() is not None:
                reader.join(5)
                pytest.fail(f"`make {target}` exited early:\n{server.output[-5000:]}")
            with contextlib.suppress(OSError):
                if server.get("/api/status")[0] == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"`make {target}` did not answer within {timeout:g} s:\n{server.output[-5000:]}")
            time.sleep(0.5)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
