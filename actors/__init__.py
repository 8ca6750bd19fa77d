"""Stages and the models they host (``omni_actors.actors``).

- :mod:`omni_actors.actors.stage`: the stage runtime, the same for every model: the
  stage actor, one session's life on it, its outlets and credit windows, input
  accumulation, codec windowing (``ChunkPolicy``) and device links between GPU stages.
- :mod:`omni_actors.actors.engines`: the models: the engine contract a stage hosts, the
  registry that finds engines by kind, the torch bases and the step loop, the scripted
  engines of the test harness, and the model families (``tiny_omni``, ``vllm``).
"""
