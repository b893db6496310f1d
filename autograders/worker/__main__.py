"""``python -m autograders.worker RESULTS_FD [OBSERVERS_FD] < job.json``: the sandboxed program (``supervisor.main``)."""

import sys

from .supervisor import main

main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
