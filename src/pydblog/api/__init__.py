"""The HTTP API of `dblog run` and `dblog sync`: health, metrics, signals, events."""
