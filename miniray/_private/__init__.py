"""miniray internals. Nothing here is public API; it may change without notice."""
