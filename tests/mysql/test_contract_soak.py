"""The shared soak scenario (tests/contract/test_soak.py) against MariaDB: repeated
snapshots under a concurrent write load with random kill -9s; the oracle holds."""

from __future__ import annotations

from tests.contract.test_soak import (  # noqa: F401 - collected by pytest
    test_soak_snapshots_under_load_with_kill9,
)
