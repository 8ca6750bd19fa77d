"""Moving messages between processes: codec, shared-memory slabs, nodes, workers."""
