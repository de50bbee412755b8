"""A multi-node Ray cluster on this machine: several raylets, each with its own resources.

For tests, demos and load tests on one machine (``synchrony cluster --local-nodes N``). The head
node runs no synchrony server (it declares no ``synchrony_node``); each added node declares one.
Ray's own footprint is kept small: no dashboard, a small object store (nothing large travels
through it: media goes straight to the nodes, signaling over HTTP).

With ``pin`` each node's processes run on cores of their own (CPU affinity, which the processes a
raylet starts later inherit), as on separate machines; otherwise every node shares all the cores
and two nodes with a session each load them like one server with two.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from app.cluster.node import NODE_RESOURCE

if TYPE_CHECKING:
    from ray._private.node import Node
    from ray.cluster_utils import Cluster

log = logging.getLogger(__name__)

OBJECT_STORE_BYTES = 80 * 1024 * 1024


def node_cores(nodes: int, cpus_per_node: int) -> list[set[int]] | None:
    """Disjoint cores for each node (``cpus_per_node`` each) from this process's affinity, or None
    when there are not enough of them."""
    cores = sorted(os.sched_getaffinity(0))
    if nodes * cpus_per_node > len(cores):
        return None
    return [set(cores[i * cpus_per_node:(i + 1) * cpus_per_node]) for i in range(nodes)]


def start_local_cluster(nodes: int, cpus_per_node: int = 1, pin: bool = False) -> Cluster:
    """A ``ray.cluster_utils.Cluster`` with a head and ``nodes`` synchrony nodes (not yet connected);
    ``pin``: each node on cores of its own (see the module docstring), if the machine has enough."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "object_store_memory": OBJECT_STORE_BYTES})
    cores = node_cores(nodes, cpus_per_node) if pin else None
    if pin and cores is None:
        log.warning("not pinning %d nodes of %d cores: only %d cores", nodes, cpus_per_node,
                    len(os.sched_getaffinity(0)))
    for i in range(nodes):
        add_local_node(cluster, cpus_per_node, cores[i] if cores else None)
    return cluster


def add_local_node(cluster: Cluster, cpus: int = 1, cores: set[int] | None = None) -> Node:
    """One more synchrony node on this machine, on ``cores`` if given; returns Ray's handle
    (``cluster.remove_node`` takes it)."""
    node = cluster.add_node(num_cpus=cpus, resources={NODE_RESOURCE: 1}, object_store_memory=OBJECT_STORE_BYTES)
    if cores:
        pin_processes([p.pid for _, p in node.live_processes()], cores)
    return node


def pin_processes(pids: list[int], cores: set[int]) -> None:
    """Put ``pids`` and every process they have started on ``cores``; what they start later inherits it."""
    import psutil

    for pid in pids:
        try:
            procs = [psutil.Process(pid)]
            procs += procs[0].children(recursive=True)
        except psutil.Error:
            continue
        for proc in procs:
            try:
                proc.cpu_affinity(sorted(cores))
            except psutil.Error:
                pass  # ended meanwhile


def stop_local_cluster(cluster: Cluster) -> None:
    """Disconnect this process from Ray, then end every node's processes."""
    import ray

    ray.shutdown()
    cluster.shutdown()
