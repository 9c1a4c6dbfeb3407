"""Pure building blocks: ids, options, resources arithmetic, wire tags, serialization, ObjectRef
and the one current-runtime slot. No threads, sockets, processes or files; imports only ``core``
and ``miniray.exceptions``."""
