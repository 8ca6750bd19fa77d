"""Qwen3-Omni: its three engines on any release, and the releases generated here.

``family`` registers the families (``qwen3-omni``'s engines; ``tiny-omni`` and
``qwen3-omni-random``, releases it writes) and imports nothing heavy. ``weights`` builds
a stage from a release (only its shards, straight onto its device) and writes tiny-omni;
``random_release`` writes the full-size one; ``vocabulary`` reads a release's tokenizer,
special ids and chat turns; ``configs`` defines tiny-omni's shapes;
``thinker_engine``, ``talker_engine`` and ``code2wav_engine`` (with their ``*_model``)
serve the stages; ``conversation_engine`` is what the thinker shares with the cascade's
text LLM. Those modules need the ``tiny-omni`` extra (transformers,
safetensors), imported through ``hf``, which names the extra when it is missing; the
rest of ``omni_actors`` does not need it.
"""
