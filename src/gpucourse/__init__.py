"""Runnable reference implementations for the GPU & data-parallel course.

One module per lesson, each named for what it holds:

- ``gpucourse.preamble``: the setup every notebook runs first (seed, device, smoke setting).
- ``gpucourse.parallel``: lesson 1, processes, threads and the GIL.
"""

from gpucourse.preamble import Setup, setup, smoke_mode

__version__ = "0.1.0"
__all__ = ["Setup", "setup", "smoke_mode", "__version__"]
