"""A program written for Ray, unchanged. Run it with ``miniray run examples/ray_program.py``:
``import ray`` then means miniray, in the driver and in every worker."""

import ray

ray.init(num_cpus=2)


@ray.remote
def fib(n):
    if n < 2:
        return n
    return sum(ray.get([fib.remote(n - 1), fib.remote(n - 2)]))


print("fib(10) =", ray.get(fib.remote(10)))
print("ray is", ray.__name__)
