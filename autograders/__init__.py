"""The course's private grader: nbgrader configuration, release and publishing, the grading engine.

    python -m autograders SUBCOMMAND ...     grade, release, publish, classroom, formgrader, bench (cli)

Two sides, with a boundary tests/test_boundary.py holds:

- the grader's side (trusted; never shown to a sandbox): ``cli`` and the modules it runs (``grade``,
  ``release``, ``publish``, ``classroom``, ``formgrader``, ``bench_grading``); the grading engine
  (``engine``: take the answers, flag, observe, judge; ``assemble`` reads a submission, ``record``
  writes the gradebook); ``sandbox`` (limits and isolation), ``namespaces`` (the isolation as root, in system
  calls) and ``preload`` (a preloaded Python that forks sandboxed runs); ``course`` (paths and nbgrader's config, ``nbgrader_config.py``);
  ``self_check_key``; and the hidden checks, ``checks/<assignment>.py``, or a package of that name with
  one module per exercise past 600 lines (``engine.load_checks`` imports them by the assignment's name);
- the sandbox's side, ``worker`` (nothing secret): what runs next to student code. A sandbox sees
  this file and ``worker/``, nothing else of this folder. ``worker`` imports ``gpucourse`` and
  never the grader's side; ``gpucourse`` never imports this package.

THREAT_MODEL.md says what each side may trust.
"""
