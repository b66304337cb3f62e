"""The gate of tests/executors/test_ray_cluster.py (module-level, so Ray actors import it by name):
a unit that lands on the doomed node holds there until its node is removed; the units on the
other nodes start only once the doomed node holds one, so the node is removed mid-unit every
time, with no sleep racing the run."""

import asyncio
import time

NAMESPACE = "variants-multinode-test"


class Gate:
    """A Ray actor (``num_cpus=0``, pinned to the head): which node is doomed, and whether a
    unit has arrived there."""

    def __init__(self, doomed_node_id):
        self.doomed_node_id = doomed_node_id
        self.held = asyncio.Event()

    async def doomed(self):
        return self.doomed_node_id

    async def arrive(self):
        self.held.set()

    async def arrived(self):
        """Returns once a unit is held on the doomed node."""
        await self.held.wait()
        return True


def gated(gate_name, fn, state, spec):
    """``fn(state, spec)`` on a surviving node, once the doomed node holds a unit; on the doomed
    node: say so and hold the unit until the node is removed (it never returns)."""
    import ray

    gate = ray.get_actor(gate_name, namespace=NAMESPACE)
    if ray.get_runtime_context().get_node_id() == ray.get(gate.doomed.remote()):
        ray.get(gate.arrive.remote())
        while True:  # the test removes this node now: the unit is lost with it
            time.sleep(3600)
    ray.get(gate.arrived.remote())
    return fn(state, spec)
