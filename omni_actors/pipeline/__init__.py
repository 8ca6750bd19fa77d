"""The pipeline: a pipeline's definition, its orchestration, and the caller's API.

The layers, each importing only the ones before it: the kernel (``omni_actors``) ←
stages and engines (``omni_actors.actors``) ← the pipeline ← the server and the CLI.
Here live the pipeline definitions (:mod:`omni_actors.pipeline.spec`), the orchestrator
that spawns and supervises the stages and admits sessions
(:mod:`omni_actors.pipeline.orchestrator`), each session's actor
(:mod:`omni_actors.pipeline.session_actor`), and the caller's API:
:class:`~omni_actors.pipeline.omni_pipeline.OmniPipeline` and its
:class:`~omni_actors.pipeline.session.Session` handle.
"""
