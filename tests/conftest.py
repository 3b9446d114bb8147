"""Shared test setup, kept tiny: one CPU thread per test process (CI has 2 shared cores)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
