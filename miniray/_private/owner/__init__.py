"""The driver's engine under one lock: tasks, leases, workers, the object table, actors and the
link to the node's actor service. Imports every layer below it."""
