"""tiny-omni: Qwen3-Omni's real architecture at toy size, the embedded default model family.

``family`` registers the family (its three engines and its ``prepare`` step) and imports
nothing heavy; ``configs`` defines the shapes and vocabularies, ``weights`` draws
deterministic random weights and saves/loads them per stage in the Hugging Face layout;
``thinker_engine``, ``talker_engine`` and ``code2wav_engine`` (with ``code2wav_model``)
serve the stages. Those modules need the ``tiny-omni`` extra (transformers,
safetensors), imported through ``hf``, which names the extra when it is missing; the
rest of ``omni_actors`` does not need it.
"""
