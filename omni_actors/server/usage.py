"""``TokenUsage``: a response's prompt and completion tokens, as the engine that wrote
the reply counted them.

The stage that writes the reply (``PipelineSpec.reply_stage``: the thinker, the entry;
a cascade's LLM, after its recognizer) reports, at the end of each response, the tokens
of the context its reply was generated from and the token ids it yielded
(``StageMetrics.prompt_tokens``/``completion_tokens``, in ``ResponseDone.metrics``): the
server reads them there rather than tokenizing anything again. An engine that does not
count (a text-free pipeline's, say) leaves the prompt at 0 and the completion at the
text deltas the server saw (one per token).
"""

from __future__ import annotations

from dataclasses import dataclass

from omni_actors.protocols.events import SessionMetrics

__all__ = ["TokenUsage", "token_usage"]


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """Tokens of one response: ``prompt`` (its context: the conversation so far) and
    ``completion`` (its reply's text tokens; audio codec frames are not counted)."""

    prompt: int
    completion: int

    @property
    def total(self) -> int:
        """Prompt and completion tokens."""
        return self.prompt + self.completion


def token_usage(metrics: SessionMetrics | None, reply_stage: str, deltas: int) -> TokenUsage:
    """The usage of a response from its metrics' ``reply_stage`` report, else ``deltas``
    text deltas and no prompt."""
    report = metrics.stages.get(reply_stage) if metrics is not None else None
    prompt = report.prompt_tokens if report is not None else None
    completion = report.completion_tokens if report is not None else None
    return TokenUsage(prompt=prompt or 0, completion=deltas if completion is None else completion)
