"""Every message that crosses an actor boundary (``omni_actors.protocols``).

Messages are msgspec ``Struct`` classes (frozen, tagged, each stating who sends it to
whom). This package imports nothing of the runtime — only msgspec, numpy, torch and the
standard library — so any process can decode the wire without it, and a reader learns
the system here. Modules, read in this order:

- :mod:`.control` — the control plane, and a session's life step by step: admission →
  prewarm → chunks → segment ends → abort.
- :mod:`.stage` — the data plane: ``Chunk`` (stage to stage, numbered per stream) and
  ``StageReport`` (a stage's end of a segment), keyed by ``SessionKey``.
- :mod:`.events` — what the caller receives: deltas, then one terminal event.
- :mod:`.error_code` — ``ErrorCode``, the kinds of failure a caller can match on.
- :mod:`.message` — ``Request[R]`` (``ask`` replies with an ``R``) and ``ControlMessage``
  (overtakes queued messages).
- :mod:`.address` — ``ActorAddress[M]``: an actor named inside a message.
- :mod:`.wire`, :mod:`.tensors` — the runtime's own envelopes between processes, and
  how a tensor travels.

Submodules are not imported here: the kernel imports :mod:`.message` and
:mod:`.address` without loading torch.
"""
