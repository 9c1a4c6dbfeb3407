"""miniray in one screen: remote functions, objects, resources and errors.

Run it with ``python examples/quickstart.py``; ``init()`` starts an embedded node, so there is
no server to set up.
"""

import time

import miniray as ray

ray.init(num_cpus=2, num_gpus=1)


@ray.remote
def square(x):
    return x * x


@ray.remote(num_gpus=0.5)
def which_gpu():
    return ray.get_gpu_ids()


@ray.remote
def fails():
    raise ValueError("this task fails on purpose")


start = time.perf_counter()
squares = ray.get([square.remote(i) for i in range(100)])
print("sum of squares:", sum(squares), f"({time.perf_counter() - start:.3f} s for 100 tasks)")

ref = ray.put(list(range(10)))
print("put/get:", ray.get(ref))

print("fractional GPUs share device:", ray.get([which_gpu.remote() for _ in range(2)]))

try:
    ray.get(fails.remote())
except ValueError as error:  # a task's exception keeps its type
    print("caught:", type(error).__name__, "-", str(error).splitlines()[-1])

print("resources:", {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")})
ray.shutdown()
print("ok")
