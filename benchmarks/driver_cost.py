"""The driver's cost of N no-op tasks, for callgrind (instructions are deterministic).

    valgrind --tool=callgrind --callgrind-out-file=/dev/null --trace-children=no \\
        python benchmarks/driver_cost.py N

init(num_cpus=2), N no-op tasks submitted then gotten, shutdown(). The per-task cost is
(instructions of the N-run minus those of the 0-run) / N; only the driver process is counted.
"""

from __future__ import annotations

import sys


def noop():
    return None


def main() -> None:
    count = int(sys.argv[1])
    import miniray as ray

    ray.init(num_cpus=2)
    f = ray.remote(noop)
    ray.get(f.remote())  # the workers and the function's export are in both runs
    if count:
        ray.get([f.remote() for _ in range(count)])
    ray.shutdown()


if __name__ == "__main__":
    main()
