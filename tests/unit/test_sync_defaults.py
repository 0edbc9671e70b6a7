"""The ``dblog`` data source's own default batch size is the sync's
(``[sync] max_events_per_trigger``): ``source.py`` keeps a copy so that Spark's planning
processes need not import the config module."""

from pydblog.config import SyncConfig
from pydblog.spark.source import DEFAULT_MAX_EVENTS


def test_the_data_source_default_is_the_sync_default() -> None:
    assert SyncConfig().max_events_per_trigger == DEFAULT_MAX_EVENTS
