"""The stage runtime: what hosts an engine, whichever model it runs.

``actor`` (``StageActor``: routes a stage's messages), ``session`` (``StageSession``:
one session's life on a stage), ``outlet`` and ``flow`` (a session's streams out and
their credit windows), ``accumulate`` (input fields merged by declared rules),
``chunk_policy`` (codec windowing), ``device_links`` (tensors between GPU stages).
"""
