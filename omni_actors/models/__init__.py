"""Model files: families of models, their releases on disk, and the weights cache.

``family`` (``ModelFamily``: a family's engines and how its weights are prepared),
``files`` (reading a release's config, shards and tokenizer, refusing bad ones),
``release`` (the Hugging Face release layout: one stage's shards read, downloaded or
written at a time),
``cache`` (prepared weights under ``$OMNI_ACTORS_CACHE``), ``heap`` (keeping the
start-up heap of torch and the models out of the collector's full collections).
"""
