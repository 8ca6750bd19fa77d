"""Typed errors raised by the omni-actors runtime.

Every error the runtime raises is an :class:`OmniError`, so callers can catch the whole
family at once, and most also derive from the matching builtin (``TypeError``,
``TimeoutError``, ``LookupError``) so generic handlers keep working. Each class carries
its :data:`~omni_actors.protocols.error_code.ErrorCode` (``code``), which is what a
session's caller receives when such an error ends a session.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from omni_actors.protocols.error_code import ErrorCode

__all__ = [
    "ActorNameTakenError",
    "ActorNotFoundError",
    "ActorRestartingError",
    "ActorStoppedError",
    "AskTimeoutError",
    "EngineError",
    "EngineStartError",
    "ErrorCode",
    "InvalidRequestError",
    "MailboxFullError",
    "MessageDroppedError",
    "MessageTypeError",
    "MissingExtraError",
    "ModelFileError",
    "OmniError",
    "ProtocolError",
    "ProtocolVersionError",
    "RestartIntensityExceededError",
    "SendTimeoutError",
    "StartTimeoutError",
    "WorkerDiedError",
    "error_code",
    "qualified_name",
]


class OmniError(Exception):
    """Base class of every error raised by omni-actors.

    Attributes:
        code: what kind of failure this is, for programs (``SessionError.code``); a
            subclass sets its own, including a user's error raised by their engine.
    """

    code: ClassVar[ErrorCode] = "internal"


class EngineError(OmniError):
    """An engine could not serve a session (bad input, a failed forward, stopped).

    Engines raise subclasses of it; any other exception out of an engine is reported
    with the same code.
    """

    code = "engine_error"


class EngineStartError(EngineError):
    """A stage's engine could not be built or started: its ``__init__`` or ``start``
    raised an error of its own (not an ``OmniError``, which says what to do itself).

    The message names the stage, the engine and the error; the original is its
    ``__cause__``, for a traceback.
    """

    def __init__(self, stage: str, kind: str, error: BaseException) -> None:
        super().__init__(
            f"stage {stage!r}: engine {kind!r} failed to start: {type(error).__name__}: {error}"
        )
        self.stage = stage
        self.kind = kind


def error_code(error: BaseException, default: ErrorCode = "internal") -> ErrorCode:
    """The code ``error`` carries, or ``default`` for an exception that is no ``OmniError``."""
    return error.code if isinstance(error, OmniError) else default


def qualified_name(error: BaseException) -> str:
    """``module:QualName`` of ``error``'s class, as ``SessionError.error_type`` gives it."""
    cls = type(error)
    return f"{cls.__module__}:{cls.__qualname__}"


class InvalidRequestError(OmniError, ValueError):
    """The caller asked a session for something it cannot do now; nothing changed."""

    code = "invalid_request"


class MessageTypeError(OmniError, TypeError):
    """A message was sent to an actor that does not declare its type."""

    def __init__(self, actor: str, message: object, accepted: tuple[type, ...]) -> None:
        names = ", ".join(t.__qualname__ for t in accepted) or "nothing"
        super().__init__(
            f"actor {actor} does not accept {type(message).__qualname__}; "
            f"it declares: {names}. Send one of those types, or add "
            f"{type(message).__qualname__} to the actor's Actor[...] union."
        )
        self.actor = actor
        self.message_type = type(message)
        self.accepted = accepted


class ActorStoppedError(OmniError):
    """The target actor is stopped (or stopped before it could reply)."""

    def __init__(self, actor: str, detail: str = "") -> None:
        text = f"actor {actor} is stopped"
        super().__init__(f"{text}: {detail}" if detail else text)
        self.actor = actor


class ActorRestartingError(ActorStoppedError):
    """A message was to carry the ref of an actor whose worker is restarting: the ref
    names no worker until the new one is up, so nothing was sent.

    Send it again once the actor is back (``remoting.sendable`` waits for that).
    """


class AskTimeoutError(OmniError, TimeoutError):
    """An ``ask`` got no reply before its deadline."""

    code = "timeout"

    def __init__(self, actor: str, message: object, timeout: float) -> None:
        super().__init__(
            f"ask to {actor} with {type(message).__qualname__} got no reply within {timeout:g}s"
        )
        self.actor = actor
        self.timeout = timeout


class MailboxFullError(OmniError):
    """The mailbox is full and the actor's overflow policy is ``fail``."""

    def __init__(self, actor: str, capacity: int) -> None:
        super().__init__(
            f"mailbox of {actor} is full ({capacity} messages) and its overflow policy "
            "is 'fail'; retry later or use the 'backpressure' policy"
        )
        self.actor = actor
        self.capacity = capacity


class MessageDroppedError(OmniError):
    """An asked message was dropped by the ``drop_oldest`` overflow policy."""

    def __init__(self, actor: str, message: object) -> None:
        super().__init__(
            f"{type(message).__qualname__} to {actor} was dropped: the mailbox was full "
            "and its overflow policy is 'drop_oldest'"
        )
        self.actor = actor


class ActorNameTakenError(OmniError, ValueError):
    """A sibling with the same name already exists."""


class ActorNotFoundError(OmniError, LookupError):
    """No live actor is registered under the looked-up path."""


class RestartIntensityExceededError(OmniError):
    """A supervisor restarted children too often and escalates to its own parent."""

    def __init__(self, supervisor: str, child: str, max_restarts: int, period: float) -> None:
        super().__init__(
            f"supervisor {supervisor} exceeded {max_restarts} restarts within {period:g}s "
            f"(last failure in {child}); its children were stopped and it escalates"
        )
        self.supervisor = supervisor
        self.child = child


class SendTimeoutError(OmniError, TimeoutError):
    """A ``tell`` waited longer than its timeout for room in a full mailbox."""

    code = "timeout"

    def __init__(self, actor: str, timeout: float) -> None:
        super().__init__(f"mailbox of {actor} stayed full for {timeout:g}s; message not sent")
        self.actor = actor
        self.timeout = timeout


class StartTimeoutError(OmniError, TimeoutError):
    """An actor's ``on_start`` did not finish before the spawn deadline."""

    code = "timeout"

    def __init__(self, actor: str, timeout: float) -> None:
        super().__init__(
            f"actor {actor} did not finish on_start within {timeout:g}s; it was stopped"
        )
        self.actor = actor
        self.timeout = timeout


class ProtocolError(OmniError):
    """Bytes from the wire are not a valid message (malformed, truncated or lying).

    Raised by decoders instead of crashing; the channel that received the bytes stays
    usable and the offending message is dropped.
    """


class ProtocolVersionError(ProtocolError):
    """A peer speaks another version of the wire protocol than this process.

    Raised during the handshake, before any message could be misread: both ends must
    run the same omni-actors release (check the worker's interpreter and environment).
    """

    def __init__(self, peer: str, ours: int, theirs: int) -> None:
        super().__init__(
            f"{peer} speaks wire protocol version {theirs}, this process speaks version "
            f"{ours}: run the same omni-actors release on both sides (a worker uses the "
            "parent's Python interpreter and import path; check for a stale install)"
        )
        self.ours = ours
        self.theirs = theirs


class WorkerDiedError(OmniError):
    """The process hosting an actor exited while the actor was running."""

    def __init__(self, actor: str, pid: int, returncode: int | None) -> None:
        how = (
            f"was killed by signal {-returncode}"
            if returncode and returncode < 0
            else (f"exited with code {returncode}")
        )
        super().__init__(f"worker process {pid} hosting {actor} {how}")
        self.actor = actor
        self.pid = pid
        self.returncode = returncode


class ModelFileError(OmniError, ValueError):
    """A model file (weights, config, tokenizer) is missing, corrupt, or in a refused format.

    Model files are input like any other: a truncated download, a full disk or a crafted
    file must stop loading with the file named, not as a library's complaint about "the
    header" of a file it does not name, and never load as some other model. A
    ``ValueError`` too: what is wrong is the file's content.

    Attributes:
        path: the file (or directory) at fault.
        problem: what is wrong with it.
        remedy: what to do about it (how to rebuild or convert it); may be empty.
    """

    def __init__(self, path: Path | str, problem: str, remedy: str = "") -> None:
        text = f"{path}: {problem}"
        super().__init__(f"{text}; {remedy}" if remedy else text)
        self.path = Path(path)
        self.problem = problem
        self.remedy = remedy


class MissingExtraError(OmniError, ImportError):
    """A feature needs packages from an optional extra of omni-actors that is not installed.

    The kernel, transport and scripted engines install with ``pip install omni-actors``;
    model families pull large libraries, so they sit behind extras. An ``ImportError`` too,
    so code that probes for an optional feature with ``except ImportError`` keeps working.
    """

    def __init__(self, feature: str, extra: str, cause: ImportError) -> None:
        missing = cause.name or str(cause)
        super().__init__(
            f"{feature} needs the {extra!r} extra of omni-actors ({missing} is missing); "
            f"install it with: pip install 'omni-actors[{extra}]'"
        )
        self.feature = feature
        self.extra = extra
        self.name = cause.name  # ImportError's: the module that is missing
