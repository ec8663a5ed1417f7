"""`python3 -m trainsup` (installed as `trainsup`): the operator commands of trainsup.tools.cli,
`trainsup quarantine ...` and `trainsup report ...`. Loads no torch."""
import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
