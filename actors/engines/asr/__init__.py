"""Speech recognition: a transcriber engine on any transformers ASR checkpoint.

``family`` registers the families (``transformers-asr``: the engine kind
``transformers.asr``; ``tiny-whisper``: a tiny Whisper with seeded random weights,
written here) and imports nothing heavy. ``engine`` serves a pipeline's transcriber
stage; ``tiny_whisper`` writes the tiny checkpoint. Both import transformers (the
``tiny-omni`` extra) only when used.
"""
