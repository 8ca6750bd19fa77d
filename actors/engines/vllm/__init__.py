"""Engines that run on vLLM (the ``omni-actors[vllm]`` extra).

Nothing here imports vLLM until a pipeline names the ``vllm`` kind: the engine module
(:mod:`.thinker`) does, inside the stage's worker process.
"""
