"""A ``bench cuda`` sink whose worker dies of SIGSEGV at the first decode-size hand-off
(workers import it by module name)."""

from __future__ import annotations

import os
import signal

from omni_actors.bench.cuda_sink import Arrived, Hidden, HiddenSink, SinkMessage, Tally

DECODE_TOKENS = 2


class DyingSink(HiddenSink):
    """:class:`HiddenSink`, except that a hand-off of ``DECODE_TOKENS`` rows kills its
    process, as a crash in native code would."""

    async def receive(self, message: SinkMessage) -> Tally | Arrived | None:
        if isinstance(message, Hidden) and message.hidden.shape[0] == DECODE_TOKENS:
            os.kill(os.getpid(), signal.SIGSEGV)
        return await super().receive(message)
