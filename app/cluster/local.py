"""A multi-node Ray cluster on this machine: several raylets, each with its own resources.

For tests, demos and load tests on one machine (``synchrony cluster --local-nodes N``). The head
node runs no synchrony server (it declares no ``synchrony_node``); each added node declares one.
Ray's own footprint is kept small: no dashboard, a small object store (nothing large travels
through it: media goes straight to the nodes, signaling over HTTP).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.cluster.node import NODE_RESOURCE

if TYPE_CHECKING:
    from ray._private.node import Node
    from ray.cluster_utils import Cluster

OBJECT_STORE_BYTES = 80 * 1024 * 1024


def start_local_cluster(nodes: int, cpus_per_node: int = 1) -> Cluster:
    """A ``ray.cluster_utils.Cluster`` with a head and ``nodes`` synchrony nodes (not yet connected)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "object_store_memory": OBJECT_STORE_BYTES})
    for _ in range(nodes):
        add_local_node(cluster, cpus_per_node)
    return cluster


def add_local_node(cluster: Cluster, cpus: int = 1) -> Node:
    """One more synchrony node on this machine; returns Ray's handle (``cluster.remove_node`` takes it)."""
    return cluster.add_node(num_cpus=cpus, resources={NODE_RESOURCE: 1}, object_store_memory=OBJECT_STORE_BYTES)


def stop_local_cluster(cluster: Cluster) -> None:
    """Disconnect this process from Ray, then end every node's processes."""
    import ray

    ray.shutdown()
    cluster.shutdown()
