"""The shared snapshot contract scenarios (tests/contract/test_snapshots.py), run here
against MariaDB through ``MariaHarness`` (the ``harness`` fixture of this directory).

Imported, not copied: once tests/contract/conftest.py parametrizes its ``harness`` over
``MariaHarness`` too, this module can go.
"""

from __future__ import annotations

from tests.contract.test_snapshots import (  # noqa: F401 - collected by pytest
    test_additional_conditions,
    test_alter_table_just_before_snapshot,
    test_bad_signals_are_rejected_and_capture_goes_on,
    test_blocking_snapshot,
    test_composite_four_column_key,
    test_initial_mode_on_first_start,
    test_kill9_mid_snapshot_resumes,
    test_regex_duplicates_and_unknown_tables,
    test_several_tables_with_restart,
    test_snapshot_only,
    test_stop_pause_resume_then_new_snapshot,
    test_surrogate_key_with_nulls_chunk_size_one,
    test_whole_table_update_in_one_transaction,
    test_writes_during_snapshot,
)
