"""The ``cascade`` model family: a speech recognizer, a text LLM and a speech
synthesizer with its codec decoder, each a stage of its own (see ``family``)."""
