"""Command line: ``python -m gpucourse doctor`` (lesson 2) and ``python -m gpucourse bench``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["doctor"]:
        from gpucourse import doctor

        print(doctor.report(doctor.diagnose(doctor.gather())))
        return 0
    if argv[:1] == ["bench"]:
        from gpucourse import bench

        return bench.main(argv[1:])
    print("usage: python -m gpucourse doctor | bench [--out DIR] [--quick]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
