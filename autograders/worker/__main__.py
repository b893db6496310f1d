"""``python -m autograders.worker RESULTS_FD OBSERVERS_FD < job.json``: the sandboxed program (``supervisor.main``)."""

import sys

from .supervisor import main

if len(sys.argv) != 3:
    raise SystemExit("usage: python -m autograders.worker RESULTS_FD OBSERVERS_FD < job.json")
main(int(sys.argv[1]), int(sys.argv[2]))
