"""Values in shared memory: segments, the store, its pure room-making policy, payload kinds.
Imports ``core``, ``host``, ``transport``."""
