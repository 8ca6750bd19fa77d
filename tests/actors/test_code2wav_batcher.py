"""``WindowBatcher``: code2wav windows of many sessions share forwards, by length."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import torch

from omni_actors.actors.engines.tiny_omni.code2wav_batcher import WindowBatcher

QUANTIZERS = 4


class FakeDecoder:
    """Records each forward's batch; row ``i``'s result is (its first code, its start)."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.fail_on = fail_on

    async def __call__(self, codes: torch.Tensor, starts: list[int]) -> list[tuple[int, int]]:
        self.batches.append([int(row[0, 0]) for row in codes])
        assert codes.shape[1] == QUANTIZERS
        if self.fail_on is not None and self.fail_on in self.batches[-1]:
            raise RuntimeError("forward failed")
        return [(int(row[0, 0]), start) for row, start in zip(codes, starts, strict=True)]


def window(tag: int, frames: int) -> torch.Tensor:
    return torch.full((QUANTIZERS, frames), tag)


@contextlib.asynccontextmanager
async def running(decoder: FakeDecoder, max_batch: int = 16) -> AsyncIterator[WindowBatcher]:
    batcher = WindowBatcher(decoder, max_batch=max_batch, wait_s=0.0)
    batcher.start()
    try:
        yield batcher
    finally:
        await batcher.stop()


async def results(futures: list[asyncio.Future[tuple[int, int]]]) -> list[tuple[int, int]]:
    return await asyncio.wait_for(asyncio.gather(*futures), 2.0)


async def test_windows_of_one_length_share_a_forward_and_each_gets_its_row() -> None:
    decoder = FakeDecoder()
    async with running(decoder) as batcher:
        futures = [batcher.submit(window(tag, 50), start=tag * 10) for tag in range(4)]
        assert await results(futures) == [(0, 0), (1, 10), (2, 20), (3, 30)]
    assert decoder.batches == [[0, 1, 2, 3]]


async def test_lengths_never_mix_and_the_oldest_goes_first() -> None:
    decoder = FakeDecoder()
    async with running(decoder) as batcher:
        lengths = {0: 29, 1: 50, 2: 29, 3: 50, 4: 7}
        futures = [batcher.submit(window(tag, n), start=0) for tag, n in lengths.items()]
        await results(futures)
    assert decoder.batches == [[0, 2], [1, 3], [4]]


async def test_a_forward_takes_at_most_max_batch_windows() -> None:
    decoder = FakeDecoder()
    async with running(decoder, max_batch=2) as batcher:
        await results([batcher.submit(window(tag, 50), start=0) for tag in range(5)])
    assert decoder.batches == [[0, 1], [2, 3], [4]]


async def test_a_withdrawn_window_is_never_decoded() -> None:
    decoder = FakeDecoder()
    async with running(decoder) as batcher:
        futures = [batcher.submit(window(tag, 50), start=0) for tag in range(3)]
        futures[1].cancel()  # its session was aborted before the batcher ran
        assert await results([futures[0], futures[2]]) == [(0, 0), (2, 0)]
    assert decoder.batches == [[0, 2]]


async def test_a_failed_forward_fails_its_rows_and_the_batcher_goes_on() -> None:
    decoder = FakeDecoder(fail_on=1)
    async with running(decoder) as batcher:
        failed = [batcher.submit(window(tag, 50), start=0) for tag in range(2)]
        for future in failed:
            with pytest.raises(RuntimeError, match="forward failed"):
                await asyncio.wait_for(future, 2.0)
        assert await results([batcher.submit(window(7, 50), start=0)]) == [(7, 0)]


async def test_stop_withdraws_what_is_queued_and_ends_the_task() -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow(codes: torch.Tensor, starts: list[int]) -> list[int]:
        started.set()
        await release.wait()
        return [0] * len(starts)

    batcher: WindowBatcher[int] = WindowBatcher(slow, max_batch=1, wait_s=0.0)
    batcher.start()
    first = batcher.submit(window(0, 5), start=0)
    queued = batcher.submit(window(1, 5), start=0)
    await asyncio.wait_for(started.wait(), 2.0)
    await batcher.stop()
    assert not batcher.running
    assert queued.cancelled()
    assert first.cancelled()  # in the forward when it stopped: withdrawn too
