"""``dblog verify``: find where a mirror differs from its source, range by key range.

- ``ranges``: key ranges, their bounds, and the row-level difference of one range;
- ``pg``: a PostgreSQL source table and PostgreSQL mirror tables (checksums in SQL);
- ``delta``: Delta mirror tables (read with delta-rs, compared row by row in Python);
- ``settle``: which differing keys may only be lag (an event in the change log between
  the two reads), and where the capture and each mirror stand;
- ``run``: the pass over the tables and the report.
"""
