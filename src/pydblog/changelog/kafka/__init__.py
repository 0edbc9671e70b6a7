"""Kafka as the change log: Debezium-shaped topics, exactly once, checkpoint in Kafka.

Topics (``P`` = ``[log] topic_prefix``; names outside ``[A-Za-z0-9._-]`` get ``_``):

- ``P.<schema>.<table>``: one per captured table, created with ``[log] partitions``.
  Message key = the event key as JSON (``{"id":7}``), partitioned by librdkafka's
  ``murmur2_random`` (Java's default partitioner: the same key, the same partition as a
  Java producer would choose), so each key's events stay in order. Value = the envelope
  ``dblog tail`` prints (``offset`` first). Headers: ``dblog.source`` (the envelope's
  ``source`` block: the source position), ``dblog.writer`` (``generation:writer-id``).
  With ``[log] value_format`` ``json-schema`` or ``avro`` key and value are in that
  Kafka Connect format (``formats``: Debezium's schemas) and the envelope rides in the
  ``dblog.event`` header, which readers take (``event_value``).
  A table's topic holds what Debezium's holds: ``c``, ``u``, ``d``, ``r`` events, and
  truncates (``op: t``, one keyless message in partition 0) only with ``[log]
  truncates = "include"`` (Debezium's ``skipped.operations = none``; by default they go
  to ``P.__dblog.truncates``, as Debezium's default skips them). With ``tombstones`` a
  delete is followed by a null-valued message of the same key (for compaction).
  Logs written before notifications had their own topic hold a table's notifications
  and truncates in every partition of its topic (copies in partitions > 0 marked
  ``dblog.fanout``): readers still read them, skipping the copies.
- ``P.__dblog.checkpoint`` (one partition, never compacted): one message per commit,
  ``{"gen", "w", "a", "b", "cp", "ends", ...}``: the commit's global offsets
  ``a <= offset < b``, the checkpoint (source position, snapshot progress), and the
  end offset of every data partition the commit wrote (``ends``, only those).
- ``P.__dblog.schemas``: the table schemas as they change; ``P.__dblog.notifications``:
  every snapshot notification, shaped as Debezium's Kafka notification channel sends
  them (``notification_value``), the envelope in the ``dblog.event`` header.

Notifications and truncates have global offsets like every event: the checkpoint
topic's cuts order them with the data (readers merge every partition by offset), so
no table topic needs a message that Debezium's would not hold.

Exactly once. Every ``append`` is one Kafka transaction of the producer whose
``transactional.id`` is ``[log] transactional_id`` (default ``dblog-P``): data
messages, then ``flush`` (every data message acknowledged), then the partitions' end
offsets, then the checkpoint message, ``flush`` again, then the commit. The delivery
reports are checked against the partitions first (``KafkaChangeLog._copies``: a broker
that answers a retried produce as a duplicate without offsets, or appends it twice,
aborts the commit rather than making an event vanish or show twice). The checkpoint message is thus
never in Kafka unless every message it describes is; it is the commit record readers
trust, not the broker's transaction markers (the test broker, Tansu, does not hide
aborted records from ``read_committed`` consumers; real Kafka does, and then the same
rules give the same answer).

Readers (``KafkaChangeLogReader``, the Spark source) read the checkpoint topic in order
and, per data partition, only offsets below the ``ends`` of a valid checkpoint, keeping
a record only if its ``dblog.writer`` header names the writer of the first valid
checkpoint whose end is above the record's offset (``Span``). Where that checkpoint
lists the partition in ``runs`` (``first``: every offset ``first <= o < end`` is one of
its records, as its delivery reports showed: no aborted record, no other writer's in
between; the notification topic gets none: its values are not envelopes), the records are taken by offset without reading headers (the
sync's fast path); a partition a commit shares with anything else is checked record by
record. A writer session has a generation
``gen`` (one more than any in the topic, or the HA fencing epoch if larger) and a random
id ``w``, and opens with a begin message; a checkpoint message is valid iff its
``(gen, w)`` is the owner: the owner changes to a message with a higher ``gen``, and
messages of any other writer (a crashed session's aborted transaction, a fenced
zombie) are ignored; an HA claim's *fence* message changes the owner without being a
commit (``KafkaChangeLog.claim``). Global offsets are dense: a new session continues at the last
valid checkpoint's ``b``.

Modules, each owning one thing:

- ``protocol``: the commit protocol, free of IO (``CommitRecord``, ``Span``,
  ``CommitLog``, ``commit_ends``, ``recover``): which messages and records are valid;
- ``topics``: topic and header names, the messages' shapes (no client);
- ``client``: the Kafka clients, their settings and bounded reads (``Client``);
- ``compat``: the one seam for brokers weaker than Apache Kafka (Tansu);
- ``writer``: the capture's transactional writer (``KafkaChangeLog``);
- ``reader``: ``KafkaChangeLogReader``, ``KafkaLogFigures``, ``sync_lag``.

Invariants (property-tested on ``protocol``):
- Per partition, valid records are in global-offset order; at every valid checkpoint
  all partitions are consistent (every event below its ``b`` is readable below ``ends``).
- Every global offset below the last valid commit's end is one valid record, exactly
  once, whatever commits, aborts and restarts interleaved before.
"""
