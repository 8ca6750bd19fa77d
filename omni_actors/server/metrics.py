"""``ServerMetrics``: the server's Prometheus metrics, served at ``/metrics``.

Each server has a registry of its own (not the process-wide default), so two servers in
one process (tests, an app that embeds one) keep separate counts. The per-stage gauges
are read from ``OmniPipeline.health()`` each time ``/metrics`` is scraped
(:meth:`ServerMetrics.stages_seen`): the stages report their state on request, not on
every change.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from omni_actors.protocols.control import PipelineHealth
from omni_actors.protocols.events import SessionMetrics

__all__ = ["ServerMetrics"]

# First text and first audio take tens of ms on a GPU and seconds on a busy CPU.
_LATENCY_BUCKETS_MS = (10, 25, 50, 100, 150, 200, 300, 500, 750, 1000, 2000, 5000, 10000)
# A chunk's hop and its copy take well under a millisecond when all is well.
_WAIT_BUCKETS_MS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000)


class ServerMetrics:
    """Counters and histograms of one server (see the module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions = Gauge("omni_sessions", "Realtime sessions open now", registry=r)
        self.sessions_total = Counter(
            "omni_sessions_opened", "Realtime sessions opened", registry=r
        )
        self.events = Counter("omni_events", "Server events sent, by type", ["type"], registry=r)
        self.client_events = Counter(
            "omni_client_events", "Client events received, by type", ["type"], registry=r
        )
        self.errors = Counter("omni_errors", "Errors reported, by code", ["code"], registry=r)
        self.responses = Counter(
            "omni_responses", "Responses ended, by status", ["status"], registry=r
        )
        self.ttft = Histogram(
            "omni_ttft_ms",
            "Time to first text of a response (ms)",
            buckets=_LATENCY_BUCKETS_MS,
            registry=r,
        )
        self.ttfa = Histogram(
            "omni_ttfa_ms",
            "Time to first audio of a response (ms)",
            buckets=_LATENCY_BUCKETS_MS,
            registry=r,
        )
        self.audio_gap = Histogram(
            "omni_audio_gap_max_ms",
            "The longest wait between two audio deltas of a response (ms)",
            buckets=_LATENCY_BUCKETS_MS,
            registry=r,
        )
        self.underruns = Counter(
            "omni_audio_underruns",
            "Times a player holding a response's first audio back by the jitter buffer "
            "(200 ms) and playing at real time would have run dry",
            registry=r,
        )
        self.stall = Counter(
            "omni_audio_stall_ms",
            "Silence those underruns would have cost (ms)",
            registry=r,
        )
        self.chunk_wait = Histogram(
            "omni_chunk_wait_max_ms",
            "Per response and stage: the longest an input chunk waited between its sender "
            "and the stage's engine (ms)",
            ["stage"],
            buckets=_WAIT_BUCKETS_MS,
            registry=r,
        )
        self.copy_wait = Histogram(
            "omni_copy_wait_ms",
            "Per response and stage: how long its outputs waited for device-to-host copies (ms)",
            ["stage"],
            buckets=_WAIT_BUCKETS_MS,
            registry=r,
        )

        self.chat_completions = Counter(
            "omni_chat_completions",
            "Chat completion requests answered, by outcome (completed, failed, or the "
            "error code that refused them)",
            ["status"],
            registry=r,
        )
        self.stage_running = Gauge(
            "omni_stage_running",
            "1 while the stage actor runs, 0 while it is restarting or stopped",
            ["stage"],
            registry=r,
        )
        self.stage_restarts = Gauge(
            "omni_stage_restarts",
            "Failures the stage actor has been restarted after",
            ["stage"],
            registry=r,
        )
        self.stage_sessions = Gauge(
            "omni_stage_sessions", "Live sessions on the stage actor", ["stage"], registry=r
        )
        self.stage_queued = Gauge(
            "omni_stage_queued",
            "Input chunks waiting for the stage's engine (its backlog)",
            ["stage"],
            registry=r,
        )

        self.transport = Gauge(
            "omni_transport",
            "The server process's transport counts: frames it refused (refused_frames) "
            "and messages sent to stage workers that died before confirming them "
            "(lost_messages: an upper bound of those lost)",
            ["count"],
            registry=r,
        )

    def transport_seen(self, counts: dict[str, int]) -> None:
        """Set the transport gauges from ``OmniPipeline.transport_counts()``."""
        for name in ("refused_frames", "lost_messages"):
            self.transport.labels(name).set(counts.get(name, 0))

    def session_opened(self) -> None:
        """A realtime session was admitted."""
        self.sessions.inc()
        self.sessions_total.inc()

    def session_closed(self) -> None:
        """A realtime session ended (for whatever reason)."""
        self.sessions.dec()

    def sent(self, event_type: str) -> None:
        """A server event of ``event_type`` went to a client."""
        self.events.labels(event_type).inc()

    def received(self, event_type: str) -> None:
        """A client event of ``event_type`` arrived (``invalid`` for one that did not parse)."""
        self.client_events.labels(event_type).inc()

    def error(self, code: str) -> None:
        """An ``error`` event (or a failed response) with ``code``."""
        self.errors.labels(code).inc()

    def response_done(self, status: str, metrics: SessionMetrics | None) -> None:
        """A response ended with ``status``; its latencies, pacing and per-stage waits,
        where it had them."""
        self.responses.labels(status).inc()
        if metrics is None:
            return
        if metrics.ttft_ms is not None:
            self.ttft.observe(metrics.ttft_ms)
        if metrics.ttfa_ms is not None:
            self.ttfa.observe(metrics.ttfa_ms)
        pacing = metrics.pacing
        if pacing is not None:
            if pacing.gap_max_ms is not None:
                self.audio_gap.observe(pacing.gap_max_ms)
            self.underruns.inc(pacing.underruns)
            self.stall.inc(pacing.stall_ms)
        for name, stage in metrics.stages.items():
            if stage.chunks_in:
                self.chunk_wait.labels(name).observe(stage.queue_wait_max_ms)
            self.copy_wait.labels(name).observe(
                sum(hop.copy_wait_ms for hop in stage.hops.values())
            )

    def chat_completion(self, status: str) -> None:
        """A chat completion request was answered with ``status``."""
        self.chat_completions.labels(status).inc()

    def stages_seen(self, health: PipelineHealth) -> None:
        """Set the per-stage gauges from the pipeline's health.

        A backlog the stage did not report in time (``queued=None``) keeps its last value.
        """
        for name, stage in health.stages.items():
            self.stage_running.labels(name).set(1 if stage.state == "running" else 0)
            self.stage_restarts.labels(name).set(stage.restarts)
            self.stage_sessions.labels(name).set(stage.sessions)
            if stage.queued is not None:
                self.stage_queued.labels(name).set(stage.queued)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
