"""The grader's sandbox side: what runs next to student code, and nothing secret.

A sandbox sees this package (with ``autograders/__init__.py``) and the course's ``gpucourse``, never
the rest of ``autograders`` (``autograders.sandbox_view.visible``). Its modules import ``gpucourse`` and
each other, never the grader's side (engine, sandbox, assemble, course, the hidden checks), and
``gpucourse`` never imports them (tests/test_boundary.py).

    python -m autograders.worker RESULTS_FD OBSERVERS_FD < job.json    the sandboxed program

- ``supervisor``: the sandbox's first process; holds the results and the observers, never runs
  student code; forks the worker and the clean copy, and watches them;
- ``runner``: the worker: runs the cells, then the observers, and reports plain data;
- ``snapshot``: what the observers rely on, put back after every cell; the modules closed to cells;
- ``trust``: the packages the observers rely on (snapshotted, scanned by the grader, preloaded);
- ``zygote``: the clean copy that forks graded multi-process launches;
- ``rank``: one rank of such a launch (the public ``gpucourse.checks.ddp_harness``, protected);
- ``forking``: the fork loop both fork servers (the zygote and ``autograders.preload``) run, and what else they share.
"""
