"""Hardware: catalog of GPUs, nodes and networks, topology, and pure cost functions (SI units)."""
