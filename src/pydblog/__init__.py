"""pydblog: DBLog-style change data capture for PostgreSQL and MySQL/MariaDB."""

__version__ = "0.1.0"
