"""The ``miniray start`` processes and what the CLI does to them: the node server, its actor
service, status collection and the daemon operations (spawn, stop). Imports every layer below."""
