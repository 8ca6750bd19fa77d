"""tiny-omni on a GPU: every stage placed on ``cuda`` through the pipeline's ``device``,
with the talker and code2wav in worker processes (outputs staged to the host) and with
every stage in one process (device tensors handed over as they are); text, audio, audio
input, concurrent sessions, and the synchronous-copy baseline all work there."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch

from omni_actors.actors.engines.qwen3_omni.thinker_model import ThinkerModel
from omni_actors.actors.stage.actor import StageActor
from omni_actors.cuda.ipc import DeviceLink
from omni_actors.models.cache import prepare
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline
from omni_actors.protocols.events import AudioDelta, Done, Event, TextDelta
from omni_actors.testing.inspection import actor_instance


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights")
    prepare("tiny-omni", cache_dir=root)
    return root


def on_gpu(
    cache: Path, *, process: bool = True, copies: str = "async", path: str = "auto"
) -> PipelineSpec:
    spec = load_pipeline("tiny-omni").with_weights(cache_dir=cache).on_device("cuda")
    if not process:
        spec = spec.with_process_stages(False)
    data = spec.model_dump(by_alias=True)
    for stage in data["stages"]:
        stage["staging"]["copies"] = copies
    for edge in data["edges"]:
        edge["path"] = path
    return PipelineSpec.model_validate(data)


async def reply(omni: OmniPipeline, **kw: object) -> tuple[str, torch.Tensor, Done]:
    events: list[Event] = [e async for e in omni.generate(**kw)]  # type: ignore[arg-type]
    last = events[-1]
    assert isinstance(last, Done), f"expected Done, got {last}"
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    pieces = [e.audio for e in events if isinstance(e, AudioDelta)]
    for piece in pieces:
        assert isinstance(piece, torch.Tensor)
        assert piece.device.type == "cpu"
    audio = torch.cat(pieces) if pieces else torch.zeros(0)
    return text, audio, last


@pytest.mark.parametrize("process", [True, False], ids=["workers", "one-process"])
async def test_text_and_audio_from_a_pipeline_on_the_gpu(cache: Path, process: bool) -> None:
    async with OmniPipeline(on_gpu(cache, process=process)) as omni:
        text, audio, done = await reply(omni, text="Hello, who are you?")
        assert text
        assert text.isprintable()
        assert audio.numel() > 0
        assert bool(torch.isfinite(audio).all())
        assert done.metrics.ttfa_ms is not None
        for name, ref in (await omni.stages()).items():
            stage = actor_instance(ref)
            if isinstance(stage, StageActor):  # in this process: its engine is on the GPU
                assert stage.transfers is not None, name
                assert getattr(stage.engine, "device", None) == torch.device("cuda", 0)
        thinker = actor_instance((await omni.stages())["thinker"])
        assert isinstance(thinker, StageActor)
        assert thinker.device_links is not None
        links = list(thinker.device_links._out.values())
        if process:  # thinker -> talker crossed processes on a device link
            assert [out.link is not None and out.link.sent > 0 for out in links] == [True]
            # Every tensor sent carried its step's mark: no copy waited for later steps.
            assert [out.link.unmarked for out in links if out.link is not None] == [0]
        else:
            assert links == []


async def test_concurrent_sessions_and_audio_input_on_the_gpu(cache: Path) -> None:
    speech = torch.sin(torch.arange(16000 * 2) * (2 * math.pi * 220 / 16000)) * 0.3
    async with OmniPipeline(on_gpu(cache)) as omni:
        results = await asyncio.gather(
            *(reply(omni, text=f"Question number {i}?") for i in range(4)),
            reply(omni, audio=speech),
        )
    for text, audio, _ in results:
        assert text
        assert audio.numel() > 0


async def test_the_synchronous_baseline_gives_the_same_reply(cache: Path) -> None:
    async with OmniPipeline(on_gpu(cache)) as omni:
        ours = await reply(omni, text="Same words, same answer.")
    async with OmniPipeline(on_gpu(cache, copies="sync")) as omni:
        baseline = await reply(omni, text="Same words, same answer.")
    assert ours[0] == baseline[0]
    assert torch.equal(ours[1], baseline[1])


async def test_the_device_link_and_the_host_path_give_the_same_reply(cache: Path) -> None:
    async with OmniPipeline(on_gpu(cache)) as omni:
        linked = await reply(omni, text="One path or the other.")
    async with OmniPipeline(on_gpu(cache, path="host")) as omni:
        hosted = await reply(omni, text="One path or the other.")
    assert linked[0] == hosted[0]
    assert torch.equal(linked[1], hosted[1])


def test_the_thinkers_constant_and_text_rows_carry_a_mark(cache: Path) -> None:
    """Every reply's first output carries the thinker's ``opening`` and ``tts`` rows, made
    at load: marked then, a copy of them waits for nothing queued since; a prompt's text
    rows are looked up on the thinker's own stream, beside the step queued on its main
    one, and marked there."""
    path = cache / "tiny-omni" / "seed-0"
    model = ThinkerModel(path, device=torch.device("cuda", 0), slots=2, max_context=64)
    torch.cuda._sleep(2_000_000_000)  # the next step, queued on the same stream
    running = torch.cuda.Event()
    running.record()
    link = DeviceLink(torch.device("cuda", 0), slots=2, slot_bytes=1 << 20)
    try:
        rows = model.text_rows([40, 41, 42])
        link.put({"opening": model.opening, "tts": model.tts, "user": rows})
        copied = torch.cuda.Event()
        copied.record(link.stream)
        copied.synchronize()
        assert not running.query()
        assert link.unmarked == 0
        table = model._embedding.weight
        assert torch.equal(rows, table[torch.tensor([40, 41, 42], device=table.device)])
        running.synchronize()
    finally:
        link.close()
