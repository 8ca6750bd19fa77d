"""Scale-out: stages placed on the nodes of a cluster (Ray), the data plane stays ours.

Ray places each stage worker (resources, a placement group per pipeline) and owns its
lifecycle on its node: a small Ray actor, the keeper (``ray_keeper``), starts our worker
process there and watches it. Ray carries only that start-up: the worker's command line
with the parent's CURVE *public* key in, its endpoint and public key out. Chunks,
control and credits go over our transport, node to node, TCP with CURVE. Ray pickles its
own actor definitions and call arguments (strings and numbers here); that stays inside
this package's Ray modules, and none of our messages go through it.

Nothing here imports ``ray`` until a pipeline with a ``cluster`` starts: Ray is an
optional extra (``omni-actors[ray]``).
"""
