"""``omni-actors bench cuda``: what handing each forward step's output to another process
costs a producing stage on a GPU, and two figures of the tiny-omni preset there.

Hand-off. A producing stage runs its forwards in a model thread (as ``TorchEngine``
does) and its event loop sends each step's hidden states to an actor in a worker process
(:mod:`omni_actors.bench.cuda_sink`), while the next step already runs. Three modes of
the same loop, per hand-off size (``decode``: a few hundred KiB; ``prefill``: 16 MiB):

- ``none``: no hand-off, the baseline step time;
- ``sync``: the model thread ends each step with ``hidden.cpu()``, the loop sends it;
- ``ours``: the model thread starts :meth:`HostStaging.begin` (a copy on a side stream)
  right after the forward, the loop awaits the copy's event and sends.

Every step ends by reading a sampled token (``.item()``), so a step lasts as long as its
GPU work, and a step's time is the interval between two step ends in the model thread:
whatever the hand-off takes from the producer (a synchronous copy, the loop late to
start the next step, the GIL) lands in it. The modes take turns in rounds (a GPU's clocks
drift). Every hand-off must arrive: the sink's count is checked after every run.

The hop is timed apart, from data ready on the producer's device to the sink having it
on its device: ``hop_ms`` is the ``ask``'s round trip (the brief reply included);
``hop_one_way_ms`` reads the sink's timestamp on ``CLOCK_MONOTONIC``, which every process
of a host shares. ``async``: host staging, then ``DeviceInbound``; ``sync``: ``.cpu()``,
then ``.to(device)``.

tiny-omni: TTFA at concurrency 1 on the device with ``staging.copies`` ``async`` vs
``sync``. Code predictor: a talker frame's residual codes, eager vs one CUDA graph.

Hop paths (host, device link on one GPU, device link to another GPU), and how long a
device link's copy waits after its step (``link_ready``): see
:mod:`~omni_actors.bench.cuda_links` and :mod:`~omni_actors.bench.cuda_ready`.

Each size, hop path and figure is a row of the report: one that fails (a lost hand-off,
a worker that dies) is that row's error (:mod:`~omni_actors.bench.rows`), and the
others still run and are reported.

With ``--device cpu`` (CI) the same loop runs at toy sizes; copies are synchronous there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import torch

from omni_actors import ActorRef, ActorSystem, Props
from omni_actors.bench.cuda_cli import SIZES, TARGET_ASYNC_OVERHEAD_PCT
from omni_actors.bench.cuda_links import measure_hops
from omni_actors.bench.cuda_model import code_predictor_bench, tiny_omni_bench
from omni_actors.bench.cuda_producer import Mode, Producer, Step, dtype_of
from omni_actors.bench.cuda_ready import measure_link_ready
from omni_actors.bench.cuda_sink import Collect, Hidden, HiddenSink, Hop, SinkMessage
from omni_actors.bench.rows import failed_rows, row, row_error
from omni_actors.bench.stats import percentile
from omni_actors.cuda import HostStaging
from omni_actors.errors import OmniError

__all__ = ["MODES", "CudaBenchConfig", "HandOffLostError", "run_cuda_bench"]

MODES: tuple[Mode, ...] = get_args(Mode)
_DEADLINE_S = 60.0  # any one wait: a step, a copy, a tell, an ask
_HOPS = 50  # measured hops per size and path, after a few warm-up ones
_ROUNDS = 5  # runs per mode and size, the modes taking turns (see _modes)

_GPU: dict[str, Any] = dict(
    steps=200, warmup=5, sizes=SIZES, hidden=4096, layers=24, tokens_decode=32,
    tokens_prefill=2048, pipeline=True, requests=8, graph=True,
)  # fmt: skip
_CPU: dict[str, Any] = dict(  # a smoke test: the same code paths at toy sizes
    steps=20, warmup=3, sizes=SIZES, hidden=64, layers=2, tokens_decode=4,
    tokens_prefill=64, pipeline=False, requests=3,
)  # fmt: skip


class HandOffLostError(OmniError):
    """A hand-off did not arrive at the sink (or arrived out of order)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaBenchConfig:
    """What ``bench cuda`` runs; :meth:`for_device` has the defaults of a device.

    The producer is ``layers`` MLP blocks (``hidden`` -> 4 x ``hidden``, GELU, back), a
    transformer layer's bulk, over ``tokens_decode`` or ``tokens_prefill`` tokens; in
    bf16 on a GPU (24 blocks of 4096, 6.4 GB of weights: on an H100, 2.8 ms a decode
    step of 32 tokens, 18 ms a prefill step of 2048), float32 on the CPU.
    """

    device: str
    steps: int
    warmup: int
    sizes: tuple[str, ...]
    hidden: int
    layers: int
    tokens_decode: int
    tokens_prefill: int
    pipeline: bool
    requests: int
    graph: bool = False
    cache_dir: Path | None = None
    seed: int = 0

    @classmethod
    def for_device(cls, device: str | None = None, **overrides: Any) -> CudaBenchConfig:
        """The defaults for ``device`` (default: a GPU if there is one), then ``overrides``.

        Raises:
            ValueError: a CUDA device without CUDA, an unknown size, a count below 1.
        """
        from omni_actors.actors.engines.torch_engine import resolve_device

        gpu = torch.device(device or "cuda").type == "cuda" and torch.cuda.is_available()
        if device is not None and torch.device(device).type == "cuda" and not gpu:
            raise ValueError(f"--device {device}: this machine has no CUDA; pass --device cpu")
        # With its index (cuda -> cuda:0): a thread or a worker sets it as its device.
        device = str(resolve_device(device or "auto"))
        config = cls(device=device, **((_GPU if gpu else _CPU) | overrides))
        unknown = set(config.sizes) - set(SIZES)
        if unknown or not config.sizes:
            raise ValueError(f"sizes must be some of {', '.join(SIZES)}, got {config.sizes}")
        counts = ("steps", "warmup", "hidden", "layers", "tokens_decode", "tokens_prefill")
        for name in (*counts, "requests"):
            if getattr(config, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(config, name)}")
        return config

    @property
    def rounds(self) -> int:
        """Runs of each mode per size, each of ``warmup`` steps then a share of ``steps``."""
        return min(_ROUNDS, self.steps)

    def tokens(self, size: str) -> int:
        """Tokens per step of hand-off size ``size``."""
        return self.tokens_decode if size == "decode" else self.tokens_prefill


async def _hand_off(
    sink: ActorRef[SinkMessage], staging: HostStaging, seq: int, step: Step
) -> None:
    """Send ``step``'s output to the sink, once its copy (if any) has completed."""
    hidden = step.host
    if step.transfer is not None:
        async with asyncio.timeout(_DEADLINE_S):
            hidden = (await step.transfer.wait(staging.waiter))["hidden"]
    if hidden is not None:
        await sink.tell(Hidden(seq, hidden), timeout=_DEADLINE_S)


async def _run_mode(
    producer: Producer,
    sink: ActorRef[SinkMessage],
    staging: HostStaging,
    size: str,
    mode: Mode,
    steps: int,
) -> tuple[list[float], int]:
    """``config.warmup`` then ``steps`` measured steps in ``mode``: the measured step
    times in ms, and how many hand-offs the sink took.

    Raises:
        HandOffLostError: the sink did not get every step's output, in order.
    """
    c = producer.config
    total = c.warmup + steps
    ends: list[float] = []
    pending = producer.call(producer.step, size, mode, staging)
    try:
        for seq in range(total):
            async with asyncio.timeout(_DEADLINE_S):
                step = await pending
            # The next step starts before this one's output leaves: an engine's thread
            # computes while its loop sends.
            if seq + 1 < total:
                pending = producer.call(producer.step, size, mode, staging)
            ends.append(step.ended)
            await _hand_off(sink, staging, seq, step)
    finally:
        pending.cancel()  # if still running, it finishes in the thread; stop() waits
    # Asked after the tells, on the same link: answered once they have been taken.
    tally = await sink.ask(Collect(), timeout=_DEADLINE_S)
    sent = 0 if mode == "none" else total
    nbytes = c.tokens(size) * c.hidden * dtype_of(producer.device).itemsize
    if (tally.count, tally.nbytes, tally.in_order) != (sent, sent * nbytes, True):
        raise HandOffLostError(
            f"{size}/{mode}: the sink took {tally.count} hand-offs ({tally.nbytes} bytes, "
            f"in order: {tally.in_order}) of {sent} sent ({sent * nbytes} bytes)"
        )
    times = [(b - a) * 1e3 for a, b in zip(ends[c.warmup - 1 :], ends[c.warmup :], strict=False)]
    return times, tally.count


async def _modes(
    producer: Producer, sink: ActorRef[SinkMessage], staging: HostStaging, size: str
) -> dict[str, dict[str, Any]]:
    """Every mode's step times for ``size``, the modes taking turns.

    A GPU's clocks drift as it warms up; run one mode after another and the last one
    pays for it. So each mode's steps are split into ``config.rounds`` runs, and each
    round runs every mode, in an order rotated by one each round.
    """
    steps, n = producer.config.steps, producer.config.rounds
    times: dict[Mode, list[float]] = {mode: [] for mode in MODES}
    taken = dict.fromkeys(MODES, 0)
    for r in range(n):
        share = steps // n + (r < steps % n)
        for mode in MODES[r % len(MODES) :] + MODES[: r % len(MODES)]:
            more, count = await _run_mode(producer, sink, staging, size, mode, share)
            times[mode] += more
            taken[mode] += count
    return {
        mode: {
            "step_ms_p50": round(percentile(times[mode], 50), 4),
            "step_ms_p90": round(percentile(times[mode], 90), 4),
            "handed_off": taken[mode],
        }
        for mode in MODES
    }


async def _hop(
    producer: Producer,
    sink: ActorRef[SinkMessage],
    staging: HostStaging,
    size: str,
    seq: int,
    copies: Literal["async", "sync"],
) -> tuple[float, float]:
    """One hop of fresh hidden states, from ready on the producer's device to loaded on
    the sink's: the ``ask``'s round trip and the one-way time, in ms (``async``: host
    staging then ``DeviceInbound``; ``sync``: ``.cpu()`` then ``.to(device)``)."""
    async with asyncio.timeout(_DEADLINE_S):
        hidden = await producer.call(producer.ready, size)
    start = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    if copies == "async":
        async with asyncio.timeout(_DEADLINE_S):
            hidden = (await staging.to_host({"hidden": hidden}))["hidden"]
    else:
        hidden = hidden.cpu()  # blocks the loop: that is the baseline
    arrived = await sink.ask(Hop(seq, hidden, copies), timeout=_DEADLINE_S)
    done = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return (done - start) / 1e6, (arrived.monotonic_ns - start) / 1e6


async def _hops(
    producer: Producer, sink: ActorRef[SinkMessage], staging: HostStaging, size: str
) -> dict[str, float]:
    """Both hop paths for ``size``, taking turns; p50 (and the async path's p90), ms."""
    count = min(producer.config.steps, _HOPS)
    warmup = max(2, count // 10)
    samples: dict[str, list[tuple[float, float]]] = {"async": [], "sync": []}
    for seq in range(warmup + count):
        for copies in ("async", "sync") if seq % 2 else ("sync", "async"):
            sample = await _hop(producer, sink, staging, size, seq, copies)
            if seq >= warmup:
                samples[copies].append(sample)
    rtt = {path: [s[0] for s in got] for path, got in samples.items()}
    one_way = {path: [s[1] for s in got] for path, got in samples.items()}
    return {
        "hop_ms_p50": round(percentile(rtt["async"], 50), 4),
        "hop_ms_p90": round(percentile(rtt["async"], 90), 4),
        "hop_one_way_ms_p50": round(percentile(one_way["async"], 50), 4),
        "hop_sync_ms_p50": round(percentile(rtt["sync"], 50), 4),
        "hop_sync_one_way_ms_p50": round(percentile(one_way["sync"], 50), 4),
    }


def _overhead(mode_p50: float, none_p50: float) -> float:
    return round((mode_p50 / none_p50 - 1) * 100, 2)


async def _hand_off_bench(
    config: CudaBenchConfig, *, graph: bool = False
) -> tuple[dict[str, Any], int]:
    """Every size: the three modes and the two hop paths; the staging pool's overflows.

    A size that fails (a lost hand-off, its sink's worker dying) is that size's
    ``{"error": ...}``; the next size still runs, against a sink of its own.
    """
    sizes: dict[str, Any] = {}
    producer: Producer | None = None
    staging: HostStaging | None = None
    try:
        producer = Producer(config, graph=graph)
        itemsize = dtype_of(producer.device).itemsize
        largest = max(config.tokens(size) * config.hidden * itemsize for size in config.sizes)
        slot_bytes = max(largest, 4096)
        staging = HostStaging(producer.device, slots=4, slot_bytes=slot_bytes)
        await producer.start()
        async with ActorSystem("bench-cuda") as system:
            for size in config.sizes:
                work = _size_row(system, producer, staging, size, slot_bytes)
                sizes[size] = await row(f"bench cuda: hand-off {size}", work)
    except Exception as exc:  # no producer or no actor system: every size left fails
        error = row_error("bench cuda: hand-off", exc)
        sizes |= {size: error for size in config.sizes if size not in sizes}
    finally:
        if staging is not None:
            await staging.close()
        if producer is not None:
            await producer.stop()
    return sizes, 0 if staging is None else staging.pool.overflows


async def _size_row(
    system: ActorSystem, producer: Producer, staging: HostStaging, size: str, slot_bytes: int
) -> dict[str, Any]:
    """``size``'s row: every mode's step times, the overheads and the hops."""
    config = producer.config
    sink = await system.spawn(
        HiddenSink,
        config.device,
        slot_bytes,
        name=f"hand-off-{size}",
        props=Props(process=True),
    )
    try:
        modes = await _modes(producer, sink, staging, size)
        none_p50 = modes["none"]["step_ms_p50"]
        async_pct = _overhead(modes["ours"]["step_ms_p50"], none_p50)
        return {
            "tokens": config.tokens(size),
            "bytes": config.tokens(size) * config.hidden * dtype_of(producer.device).itemsize,
            "modes": modes,
            "sync_overhead_pct": _overhead(modes["sync"]["step_ms_p50"], none_p50),
            "async_overhead_pct": async_pct,
            "target_async_overhead_pct": TARGET_ASYNC_OVERHEAD_PCT,
            "met": async_pct <= TARGET_ASYNC_OVERHEAD_PCT,
        } | await _hops(producer, sink, staging, size)
    finally:
        await system.stop(sink)


async def run_cuda_bench(config: CudaBenchConfig) -> dict[str, Any]:
    """Measure the hand-off modes, then (CUDA only) the code predictor eager vs in a CUDA
    graph, then (``config.pipeline``) tiny-omni's TTFA with async vs sync copies.

    Returns:
        A JSON-ready dict: ``device``, ``torch``, ``cuda``, ``machine``, ``parameters``,
        ``sizes`` (per size: ``modes``, each with ``step_ms_p50``/``p90`` and
        ``handed_off``; ``sync_overhead_pct``, ``async_overhead_pct``,
        ``target_async_overhead_pct``, ``met``; ``hop_ms_p50``/``p90`` and
        ``hop_one_way_ms_p50``, and the same for the sync path), ``sizes_graphed_steps``
        (the same with steps replayed from CUDA graphs), ``hop_paths`` (see
        :func:`~omni_actors.bench.cuda_links.measure_hops`), ``link_ready`` (see
        :func:`~omni_actors.bench.cuda_ready.measure_link_ready`), ``staging_overflows``,
        ``code_predictor``, ``tiny_omni`` (``{"skipped": why}`` when not run),
        ``wall_s``, and ``failed_rows``: the rows that failed.

    A row that fails (a lost hand-off, :class:`HandOffLostError`; a worker that died;
    any error of its own) is reported as ``{"error": "<type>: <message>"}`` in its
    place and named in ``failed_rows``; the rows after it still run.
    """
    from omni_actors.bench.pipeline import _machine

    started = time.perf_counter()
    device = torch.device(config.device)
    sizes, overflows = await _hand_off_bench(config)
    graphed: dict[str, Any] = {"skipped": "eager steps only (--graph for CUDA graphs)"}
    if config.graph and device.type == "cuda":
        graphed, more = await _hand_off_bench(config, graph=True)
        overflows += more
    # Each of these is its row's error if it fails; the report keeps the rest.
    paths = await row("bench cuda: hop paths", measure_hops())
    ready = await row("bench cuda: link ready", measure_link_ready(config))
    predictor = await row("bench cuda: code predictor", code_predictor_bench(config))
    pipeline: dict[str, Any] = {"skipped": "no --pipeline"}
    if config.pipeline:
        pipeline = await row("bench cuda: tiny-omni", tiny_omni_bench(config))
    parameters = dataclasses.asdict(config) | {
        "sizes": list(config.sizes),
        "rounds": config.rounds,
        "cache_dir": None if config.cache_dir is None else str(config.cache_dir),
        "dtype": str(dtype_of(device)).removeprefix("torch."),
    }
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "machine": _machine(),
        "parameters": parameters,
        "sizes": sizes,
        "sizes_graphed_steps": graphed,
        "hop_paths": paths,
        "link_ready": ready,
        "staging_overflows": overflows,
        "code_predictor": predictor,
        "tiny_omni": pipeline,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    report["failed_rows"] = failed_rows(report)
    return report
