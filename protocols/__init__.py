"""Every message that crosses a process boundary (``omni_actors.protocols``).

Messages are msgspec ``Struct`` classes grouped in tagged unions per family; this package
imports nothing else of omni-actors, so any process can decode the wire without the
runtime.
"""
