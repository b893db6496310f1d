"""``python -m autograders SUBCOMMAND ...``: see ``autograders.cli``."""

import sys

from .cli import main

sys.exit(main())
