"""The worker process: the fork server's server half, the task loop, the in-worker API and the
actor host. Imports every layer below ``owner``/``worker``."""
