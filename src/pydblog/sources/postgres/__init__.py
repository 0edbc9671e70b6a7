"""PostgreSQL source: logical replication with pgoutput."""
