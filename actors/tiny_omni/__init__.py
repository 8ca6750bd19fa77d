"""tiny-omni: Qwen3-Omni's real architecture at toy size, the embedded default model family.

``configs`` defines the shapes and vocabularies, ``weights`` draws deterministic random
weights and saves/loads them per stage in the Hugging Face layout. Importing this package
needs ``transformers``; the rest of ``omni_actors`` does not.
"""
