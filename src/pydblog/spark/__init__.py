"""The sync pipeline on Spark: the ``dblog`` data source, the per-batch reduce, the
sinks (Delta mirror, downstream PostgreSQL, change history) and the job that ties them
together (``dblog sync``, see ``job.run_sync`` and docs/sync.md)."""
