"""Serving: the layer over stages that a caller talks to.

The tree shows the layers, each importing only the ones before it: the kernel
(``omni_actors``) ← stages and engines (``omni_actors.actors``) ← serving. Here live the
pipeline definitions (:mod:`.pipeline_spec`), the orchestrator that spawns and supervises
the stages and admits sessions (:mod:`.orchestrator`), each session's actor
(:mod:`.session_actor`), and the caller's API: :class:`~.omni_pipeline.OmniPipeline` and
its :class:`~.session.Session` handle.
"""
