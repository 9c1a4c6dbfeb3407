"""Who holds which resources on this node and host: the node ledger, host GPU shares, the
file locks they share, GPU detection and the host inventory. Imports ``core``, ``host``,
``transport``."""
