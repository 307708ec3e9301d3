"""put_mode write_behind and coalesce: the table of accepted writes, the flusher and its rounds."""
