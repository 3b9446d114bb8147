"""`python -m rollhub ...` is the `rollhub` command; it is also what `torchrun -m rollhub train RECIPE` runs on
every rank (rollhub.trainer.ranks)."""

import sys

from rollhub.cli import main

if __name__ == "__main__":
    sys.exit(main())
