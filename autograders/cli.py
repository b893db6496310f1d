"""One command line for the grader: ``python -m autograders SUBCOMMAND ...`` (what the Makefile runs).

Each subcommand hands the rest of the line to its module's ``main(argv)`` (``python -m autograders
grade -h`` shows that module's own flags). Modules are imported only for their subcommand: ``release``
needs nbgrader, not the grading engine.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# subcommand -> (module of this package, what it does)
COMMANDS = {
    "grade": ("grade", "grade a class: make grade SUBMISSIONS=<dir> RESULTS=<dir>"),
    "release": ("release", "regenerate course/ from solutions/: make release"),
    "publish": ("publish", "write the public student edition: make publish"),
    "classroom": ("classroom", "write a class of fixture submissions and the scores they should get"),
    "formgrader": ("formgrader", "register and release the assignments for Formgrader: make formgrader"),
    "bench": ("bench_grading", "measure grading a class: make bench"),
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m autograders", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for name, (_, summary) in COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)  # -h and every flag go to the module's own parser
    return top


def main(argv: list[str] | None = None) -> int:
    args, rest = parser().parse_known_args(argv)
    if args.command == "publish":  # the edition's files, not the interpreter's caches
        os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    module = importlib.import_module(f"{__package__}.{COMMANDS[args.command][0]}")
    sys.argv[0] = f"{parser().prog} {args.command}"  # what the module's own usage line shows
    return module.main(rest)
