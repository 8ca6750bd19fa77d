"""The vLLM thinker's audio input, without vLLM: a clip is handed over window by window.

``ClipStream`` cuts the clip into the audio encoder's attention windows (800 log-mel
frames, 8 s) as its samples arrive; each window becomes a clip of the token list as soon
as its last frame is final, with the features the torch thinker's front end computes.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch

from omni_actors.actors.engines.qwen3_omni import configs
from omni_actors.actors.engines.qwen3_omni.audio_stream import MIN_SAMPLES
from omni_actors.actors.engines.qwen3_omni.log_mel import LogMel
from omni_actors.actors.engines.vllm.audio_input import (
    AudioSpec,
    ClipStream,
    audio_items,
    user_rows,
)
from omni_actors.actors.engines.vllm.conversation import Clip, History, VllmInputError
from omni_actors.actors.engines.vllm.turns import Turn, TurnTemplate

RATE = configs.AUDIO_SAMPLE_RATE
FRAME = 320  # 20 ms, as a microphone sends it
START, PAD, END = 7, 8, 9
SPEC = AudioSpec(
    ids=(START, PAD, END),
    rate=RATE,
    n_window=50,
    n_window_infer=800,
    accept_layer=1,
    features={"feature_size": 128, "sampling_rate": RATE, "hop_length": 160, "n_fft": 400},
)


def speech(seconds: float, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return 0.1 * torch.randn(int(seconds * RATE), generator=generator)


def whole_clip_mel(samples: torch.Tensor) -> torch.Tensor:
    """The torch thinker's log-mel of the clip, computed in one go."""
    mel = LogMel(configs.audio_feature_extractor(), block=100)
    mel.push(samples.numpy())
    return torch.cat((mel.take(), mel.finish()), dim=1)


def test_the_extractor_is_the_torch_thinkers() -> None:
    ours = SPEC.extractor()
    theirs = configs.audio_feature_extractor()
    assert (ours.n_fft, ours.hop_length) == (theirs.n_fft, theirs.hop_length)
    assert torch.equal(torch.as_tensor(ours.mel_filters), torch.as_tensor(theirs.mel_filters))


def test_each_window_is_handed_over_once_its_last_frame_is_final() -> None:
    samples = speech(20.0)
    stream = ClipStream(SPEC, SPEC.extractor())
    handed: list[tuple[int, Clip]] = []  # (samples pushed when handed over, clip)
    for at in range(0, samples.numel(), FRAME):
        for clip in stream.push(samples[at : at + FRAME]):
            handed.append((at + FRAME, clip))
    # Window k's last frame (800k - 1) is final once sample 160 * (800k - 1) + 200 is in.
    assert [when for when, _ in handed] == [128_320, 256_320]
    tail = stream.end()
    assert len(tail) == 1
    clips = [clip for _, clip in handed] + tail
    assert [c.count for c in clips] == [104, 104, 52]  # 2000 frames: 13 outputs per second
    assert [c.features.shape[1] for c in clips] == [800, 800, 400]
    # The same features as the torch thinker's front end over the whole clip.
    assert torch.equal(torch.cat([c.features for c in clips], dim=1), whole_clip_mel(samples))
    assert len({c.uuid for c in clips}) == 3
    assert stream.end() == []  # the clip ended: the next push starts another


def test_a_clip_of_one_window_exactly_is_handed_over_at_its_end() -> None:
    stream = ClipStream(SPEC, SPEC.extractor())
    assert stream.push(speech(8.0)) == []  # its last frames wait for the end's padding
    (clip,) = stream.end()
    assert (clip.count, clip.features.shape[1]) == (104, 800)


def test_a_clip_too_short_to_hear_and_a_dropped_one_give_nothing() -> None:
    stream = ClipStream(SPEC, SPEC.extractor())
    assert stream.push(torch.zeros(0)) == []
    assert stream.end() == []
    stream.push(speech(1.0)[: MIN_SAMPLES - 1])
    assert stream.end() == []
    assert stream.push(speech(9.0))  # a window was handed over
    stream.drop()
    assert stream.end() == []  # the rest is gone with it


def test_bad_samples_are_refused() -> None:
    stream = ClipStream(SPEC, SPEC.extractor())
    with pytest.raises(VllmInputError, match="floating-point"):
        stream.push(torch.zeros(10, dtype=torch.int16))
    with pytest.raises(VllmInputError, match="NaN"):
        stream.push(torch.full((10,), float("inf")))


def test_audio_items_lay_the_windows_side_by_side() -> None:
    clips = [Clip(torch.randn(128, n), SPEC.count(n), str(n)) for n in (800, 3)]
    items = audio_items(clips)
    assert items["input_audio_features"].shape == (128, 803)
    assert items["audio_feature_lengths"].tolist() == [800, 3]
    assert items["feature_attention_mask"].sum(dim=1).tolist() == [800, 3]


TURNS = TurnTemplate(
    system=Turn((1, 5), (3,)),
    user=Turn((1, 2), (3,)),
    assistant=Turn((1, 4), (3,)),
    opening=(1, 4),
)


def test_a_clip_of_several_windows_gives_rows_framed_per_window() -> None:
    turns = TURNS
    history = History()
    stream = ClipStream(SPEC, SPEC.extractor())
    clips = [*stream.push(speech(9.0)), *stream.end()]
    for clip in clips:
        history.hear(clip, turns, SPEC.ids)
        clip.states = torch.full((clip.count, 4), 0.5)
    committed = history.commit(turns)
    assert committed is not None
    turn, _ = committed
    embeddings = torch.arange(10.0)[:, None].expand(10, 4)
    rows = user_rows(history, turn, embeddings)
    mask = rows["user_mask"]
    assert isinstance(mask, torch.Tensor)
    # <user> <start> 104 pads <end> <start> 13 pads <end> </user>
    want = [False] * 3 + [True] * 104 + [False] * 2 + [True] * 13 + [False] * 2
    assert mask.tolist() == want
    user = rows["user"]
    assert isinstance(user, torch.Tensor)
    assert torch.equal(user[mask], torch.full((117, 4), 0.5))
    assert user[~mask][:, 0].tolist() == [1, 2, START, END, START, END, 3]


def test_the_open_turns_rows_go_ahead_as_they_become_final() -> None:
    history = History()
    history.say([5, 6], TURNS)
    first = Clip(torch.zeros(128, 800), 4, "a")
    history.hear(first, TURNS, SPEC.ids)
    # Prefilled as far as the clip, whose states are not taken yet: the text before it.
    assert history.unsent(len(history.tokens)) == range(5)
    assert history.unsent(3) == range(3)  # only what vLLM holds
    first.states = torch.ones(4, 4)
    sent = history.unsent(len(history.tokens))
    assert sent == range(len(history.tokens))
    history.ahead.output(torch.zeros(len(sent), 4), torch.zeros(len(sent), dtype=torch.bool))
    history.say([6], TURNS)
    assert history.unsent(len(history.tokens)) == range(len(sent), len(sent) + 1)
    committed = history.commit(TURNS)
    assert committed is not None
    rows, ahead = committed
    # The commit sends the rest, counted with the rows sent ahead; the next turn is new.
    assert rows == range(len(sent), len(history.tokens))
    assert ahead.sent == len(sent)
    assert history.ahead.sent == 0
    assert history.unsent(len(history.tokens)) == range(0)


def test_a_clear_takes_back_the_rows_sent_ahead_and_a_failure_forgets_them() -> None:
    history = History()
    mark = history.checkpoint()
    history.say([5, 6], TURNS)
    history.ahead.output(torch.zeros(4, 4), torch.zeros(4, dtype=torch.bool))
    history.clear(mark)
    out = history.ahead.output(None, None)
    assert out is not None
    assert out["user_edits"].tolist() == [-4]  # type: ignore[union-attr]
    assert history.ahead.output(None, None) is None
    history.say([5], TURNS)
    history.ahead.output(torch.zeros(3, 4), torch.zeros(3, dtype=torch.bool))
    history.restore(mark)  # a failed response: the talker's response failed with it
    assert history.ahead.output(None, None) is None
