"""Helpers shared by the sandbox tests (a unique module name: tests/ has several conftests)."""

from __future__ import annotations

import uuid

TEST_RUN_PREFIX = "pytest-"


def new_test_run_id() -> str:
    """Run ids of test backends share a prefix, so the session guard can find leftovers."""
    return f"{TEST_RUN_PREFIX}{uuid.uuid4().hex[:12]}"
