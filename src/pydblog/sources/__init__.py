"""Sources: each turns a database's log into pydblog's stream (see ``ports.LogSource``)."""
