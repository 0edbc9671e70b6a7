"""Change log backends. The embedded default is ``SqliteChangeLog``."""
