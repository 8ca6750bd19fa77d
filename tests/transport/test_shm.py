"""Shared-memory slabs: one copy in, zero copies out, slots freed, nothing leaked."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from omni_actors.errors import ProtocolError
from omni_actors.transport.shm import SHM_DIR, SlabReader, SlabWriter, sweep


def _ours() -> set[str]:
    """Segments this test process created (other runs may share /dev/shm)."""
    return {n for n in os.listdir(SHM_DIR) if n.startswith(f"omni-actors-{os.getpid()}-")}


@pytest.fixture(autouse=True)
def _no_leaked_segments() -> Iterator[None]:
    before = _ours()
    yield
    gc.collect()
    assert _ours() <= before, f"leaked: {_ours() - before}"


@pytest.fixture
def pair() -> Iterator[tuple[SlabWriter, SlabReader]]:
    writer = SlabWriter.create(slots=2, slot_bytes=1 << 20, slab_id=7)
    reader = SlabReader()
    reader.attach(writer.name, 7)
    writer.unlink()
    yield writer, reader
    reader.close()
    writer.close()


def test_one_copy_in_zero_copies_out(pair: tuple[SlabWriter, SlabReader]) -> None:
    writer, reader = pair
    source = torch.arange(1000, dtype=torch.float32)
    slab, slot, offset = writer.put(source.numpy().data.cast("B")) or (0, 0, 0)
    source.zero_()  # the slot holds its own copy
    view = reader.view(slab, slot, offset, 4000)
    tensor = torch.frombuffer(view, dtype=torch.float32)
    assert torch.equal(tensor, torch.arange(1000, dtype=torch.float32))
    mapping = reader._slabs[7]
    assert mapping.mm is not None
    base = np.frombuffer(mapping.mm, np.uint8).ctypes.data
    assert tensor.data_ptr() == base + mapping.data + slot * mapping.slot_bytes + offset


def test_slots_return_when_the_last_view_dies(pair: tuple[SlabWriter, SlabReader]) -> None:
    writer, reader = pair
    data = memoryview(bytes(1000))
    placed = [writer.put(data) for _ in range(2)]
    assert None not in placed
    assert writer.put(data) is None  # exhausted: the caller falls back to a frame
    assert writer.busy() == 2
    slab, slot, _ = placed[0]  # type: ignore[misc]
    view = reader.view(slab, slot, 0, 1000)
    tensor = torch.frombuffer(view, dtype=torch.uint8).reshape(10, 100)
    part = tensor[2:4]
    array = np.frombuffer(view, np.uint8)[::2]
    del view, tensor
    gc.collect()
    assert writer.busy() == 2  # ``part`` and ``array`` still hold it
    del part
    gc.collect()
    assert writer.busy() == 2
    del array
    gc.collect()
    assert writer.busy() == 1
    assert writer.put(data) is not None


def test_oversized_data_is_not_placed(pair: tuple[SlabWriter, SlabReader]) -> None:
    writer, _ = pair
    assert writer.put(memoryview(bytes((1 << 20) + 1))) is None


def test_views_outside_the_slab_raise(pair: tuple[SlabWriter, SlabReader]) -> None:
    _, reader = pair
    with pytest.raises(ProtocolError, match="unknown slab"):
        reader.view(99, 0, 0, 1)
    with pytest.raises(ProtocolError, match="slot 5"):
        reader.view(7, 5, 0, 1)
    with pytest.raises(ProtocolError, match="do not fit"):
        reader.view(7, 0, 1 << 20, 1)
    with pytest.raises(ProtocolError, match="do not fit"):
        reader.view(7, 0, -1, 1)


def test_foreign_or_missing_segments_are_refused(tmp_path: object) -> None:
    reader = SlabReader()
    with pytest.raises(ProtocolError, match="not an omni-actors slab"):
        reader.attach("../etc/passwd", 1)
    with pytest.raises(ProtocolError, match="cannot open"):
        reader.attach("omni-actors-0-missing", 1)
    name = f"omni-actors-{os.getpid()}-foreign"
    path = os.path.join(SHM_DIR, name)
    with open(path, "wb") as f:
        f.write(b"NOTASLAB" + bytes(8192))
    try:
        with pytest.raises(ProtocolError, match="no valid slab header"):
            reader.attach(name, 1)
    finally:
        os.unlink(path)


READER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from omni_actors.transport.shm import SlabReader
    reader = SlabReader()
    reader.attach(sys.argv[1], 0)
    view = reader.view(0, 0, 0, 8)
    print(int(np.frombuffer(view, np.int64)[0]), flush=True)
    if sys.argv[2] == "release":
        del view
        import gc; gc.collect()
        print("released", flush=True)
    else:
        print("holding", flush=True)
        time.sleep(60)  # holds the slot until the test kills it: the behaviour under test
    """
)


def _reader(name: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", READER, name, mode], stdout=subprocess.PIPE, text=True
    )


def test_reader_in_another_process_reads_and_releases() -> None:
    with SlabWriter.create(slots=1, slot_bytes=4096) as writer:
        assert writer.put(np.array([424242], dtype=np.int64).data.cast("B")) == (0, 0, 0)
        proc = _reader(writer.name, "release")
        out, _ = proc.communicate(timeout=60)
        assert out.split() == ["424242", "released"]
        assert writer.busy() == 0


def test_killed_reader_then_reset_makes_slots_reusable() -> None:
    with SlabWriter.create(slots=1, slot_bytes=4096) as writer:
        writer.put(np.array([7], dtype=np.int64).data.cast("B"))
        proc = _reader(writer.name, "hold")
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "7"
        assert proc.stdout.readline().strip() == "holding"
        writer.unlink()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        assert writer.busy() == 1
        assert writer.put(memoryview(bytes(8))) is None
        writer.reset()
        assert writer.put(memoryview(bytes(8))) is not None


def test_killed_writer_leaves_nothing_after_unlink_and_sweep_removes_the_rest() -> None:
    script = textwrap.dedent(
        """
        import os, sys, time
        from omni_actors.transport.shm import SlabWriter
        a = SlabWriter.create(slots=1, slot_bytes=4096)
        b = SlabWriter.create(slots=1, slot_bytes=4096)
        a.unlink()  # as after the peer attached
        print(os.getpid(), flush=True)
        time.sleep(60)  # alive until the test kills it: the behaviour under test
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    proc.kill()
    proc.wait(timeout=30)
    proc.stdout.close()

    def left() -> set[str]:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(f"omni-actors-{pid}-")}

    assert len(left()) == 1  # only the never-attached one
    assert sweep(pid) == 1
    assert not left()


def test_geometry_validation() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        SlabWriter.create(slots=0)


def test_a_slot_that_holds_no_message_cannot_be_viewed(
    pair: tuple[SlabWriter, SlabReader],
) -> None:
    _, reader = pair
    with pytest.raises(ProtocolError, match="holds no message"):
        reader.view(7, 0, 0, 8)  # a stale or forged descriptor


def test_views_outliving_forget_still_free_their_slot(
    pair: tuple[SlabWriter, SlabReader],
) -> None:
    writer, reader = pair
    placed = writer.put(memoryview(bytes(64)))
    assert placed is not None
    view = reader.view(placed[0], placed[1], 0, 64)
    reader.forget(7)
    assert writer.busy() == 1
    del view
    gc.collect()
    assert writer.busy() == 0
