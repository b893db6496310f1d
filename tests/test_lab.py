"""`make lab` serves course/ in JupyterLab with nbgrader's Validate button and Formgrader."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import ROOT

TOKEN = "gpucourse-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture(scope="module")
def lab():
    port = _free_port()
    args = f"--no-browser --ip=127.0.0.1 --port={port} --ServerApp.token={TOKEN} --ServerApp.port_retries=0"
    proc = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS={args}"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            if proc.poll() is not None:
                pytest.fail(f"`make lab` exited early:\n{proc.stdout.read()}")
            try:
                if _get(f"{base}/api/status?token={TOKEN}")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not answer within 60 s")
        yield base
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_lab_opens_on_course(lab):
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        opener.open(f"{lab}/?token={TOKEN}", timeout=10)
        location = None
    except urllib.error.HTTPError as redirect:
        location = redirect.headers.get("Location", "")
    assert location and location.split("?")[0].endswith("/lab/tree/course"), f"/ redirects to {location!r}"
    assert _get(f"{lab}/lab/tree/course?token={TOKEN}")[0] == 200
    status, listing = _get(f"{lab}/api/contents/course?token={TOKEN}")
    assert status == 200 and "lesson01_processes_threads" in listing


def test_nbgrader_lab_extension_is_loaded(lab):
    _, page = _get(f"{lab}/lab?token={TOKEN}")
    assert "@jupyter/nbgrader" in page, "nbgrader's JupyterLab extension (Validate button) is missing"


def test_formgrader_sees_the_course(lab):
    status, page = _get(f"{lab}/formgrader/manage_assignments?token={TOKEN}")
    assert status == 200, f"Formgrader answered {status}"
    status, assignments = _get(f"{lab}/formgrader/api/assignments?token={TOKEN}")
    assert status == 200 and "lesson01_processes_threads" in assignments, assignments[:500]
