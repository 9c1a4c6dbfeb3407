"""Python calls per no-op task in the driver, by function: the submitting thread and the
others (the I/O thread), for A/B decisions beside ``driver_cost.py``'s instructions.

    python benchmarks/call_counts.py [--round-trips] [N]

init(num_cpus=2), 200 warm-up tasks, then N no-ops (default 3,000) submitted then gotten
(``--round-trips``: N sequential ``get(f.remote())``) under a profile hook that counts only
during them. Prints calls per task for each thread group, then the most called functions
("M" the submitting thread, "I" the others).
"""

from __future__ import annotations

import collections
import sys
import threading


def noop():
    return None


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    count = int(args[0]) if args else 3000
    round_trips = "--round-trips" in sys.argv
    counts: collections.Counter = collections.Counter()
    on = [False]
    main_thread = threading.get_ident()

    def profile(frame, event, _arg):
        if event == "call" and on[0]:
            code = frame.f_code
            counts[(threading.get_ident() == main_thread,
                    code.co_filename.rsplit("/", 1)[-1], code.co_name)] += 1

    threading.setprofile(profile)  # the I/O thread starts in init(): it gets the hook too
    sys.setprofile(profile)
    import miniray as ray

    ray.init(num_cpus=2)
    f = ray.remote(noop)
    ray.get([f.remote() for _ in range(200)])
    on[0] = True
    if round_trips:
        for _ in range(count):
            ray.get(f.remote())
    else:
        ray.get([f.remote() for _ in range(count)])
    on[0] = False
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    ray.shutdown()
    totals: collections.Counter = collections.Counter()
    for (is_main, _file, _name), calls in counts.items():
        totals[is_main] += calls
    print(f"Python calls per task: submitting thread {totals[True] / count:.1f}, "
          f"others {totals[False] / count:.1f}")
    for (is_main, file, name), calls in counts.most_common(60):
        print(f"{'M' if is_main else 'I'} {calls / count:6.2f} {file}:{name}")


if __name__ == "__main__":
    main()
