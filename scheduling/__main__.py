"""`python -m scheduling <command>`: see scheduling.cli."""

import sys

from scheduling.cli import main

if __name__ == "__main__":
    sys.exit(main())
