"""``ray start`` with every address of the node on 127.0.0.1 (tests only).

Ray turns ``--node-ip-address=127.0.0.1`` into the machine's routable address
(ray._private.services.resolve_ip_for_localhost) unless the single-machine mode of
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is on, and that mode refuses to start a worker
node. So: the environment keeps the single-machine mode (every process the node
starts asks for its address and gets 127.0.0.1), and this launcher alone lets the
worker node start and resolve 127.0.0.1 to itself.

Usage: python ray_loopback_node.py start --address=127.0.0.1:PORT ... (as ``ray``).
"""
import sys

from ray._private import ray_constants, services

ray_constants.ENABLE_RAY_CLUSTER = True          # allow `ray start --address` (a worker node)
services.get_node_ip_address = lambda address=None: "127.0.0.1"

from ray.scripts.scripts import main

sys.exit(main())
