"""Bytes between local processes: framed sockets, the I/O reactor, unix-socket helpers and the
client halves of the spawn channels (fork server, node). Imports ``core`` and ``host``."""
