"""tiny-omni: real Qwen3-Omni classes at toy size, written as a release, loaded per stage.

These tests pin what the engines rely on: deterministic weights in the HF layout, KV-cached
thinker decoding equal to a full forward, a streamed code2wav equal to the full decode, the
audio front end, and the step functions reproducing HF's own end-to-end ``generate``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")

import torch
from safetensors.torch import load_file, save_file
from tiny_omni_ids import ASSISTANT_OPENING, Tokens, encode, feature_extractor, system_turn
from transformers import DynamicCache, Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeForConditionalGeneration,
)

from omni_actors.actors.engines.qwen3_omni import configs, stepping, weights
from omni_actors.errors import ModelFileError
from omni_actors.models.release import INDEX, Release

Models = tuple[Any, Any, Any]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-omni")
    weights.build(out, seed=0)
    return out


@pytest.fixture(scope="module")
def models(built: Path) -> Models:
    thinker, talker, code2wav = (weights.load(built, stage) for stage in weights.STAGES)
    return thinker, talker, code2wav


def _one_second(seed: int = 0) -> dict[str, torch.Tensor]:
    audio = np.random.default_rng(seed).standard_normal(16_000).astype(np.float32) * 0.1
    features = feature_extractor()(
        audio,
        sampling_rate=configs.AUDIO_SAMPLE_RATE,
        padding=True,
        truncation=False,
        return_attention_mask=True,
        return_tensors="pt",
    )
    return {
        "input_features": features["input_features"],
        "feature_attention_mask": features["attention_mask"],
    }


@pytest.mark.integration
def test_build_writes_a_release_each_stage_loads_from(built: Path, models: Models) -> None:
    index = json.loads((built / INDEX).read_text())["weight_map"]
    shards = sorted(set(index.values()))
    assert len(shards) > 2
    assert shards == [
        f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)
    ]
    # code2wav alone in the last shard, as in Qwen3-Omni's release; experts one per key.
    assert {n for n, f in index.items() if f == shards[-1]} == {
        n for n in index if n.startswith("code2wav.")
    }
    assert "thinker.model.layers.0.mlp.experts.1.up_proj.weight" in index
    assert "talker.model.layers.0.mlp.experts.0.down_proj.weight" in index
    for stage, model in zip(weights.STAGES, models, strict=True):
        assert type(model).__name__ == weights.STAGE_CLASSES[stage].__name__
        assert not model.training
    composite = Qwen3OmniMoeConfig.from_pretrained(built)
    assert composite.tts_eos_token_id == Tokens.TTS_EOS
    _, talker, code2wav = models
    assert talker.config.num_code_groups == code2wav.config.num_quantizers
    assert talker.config.code_predictor_config.vocab_size == code2wav.config.codebook_size
    assert int(code2wav.total_upsample) == configs.SAMPLES_PER_FRAME


@pytest.mark.integration
def test_a_stage_opens_only_the_shards_that_hold_it(built: Path) -> None:
    index = json.loads((built / INDEX).read_text())["weight_map"]
    for stage in weights.STAGES:
        release = Release.open(built)
        weights.load(built, stage, release=release)
        own = {built / f for n, f in index.items() if n.startswith(f"{stage}.")}
        assert set(release.opened) == own, stage
    assert len(own) == 1  # code2wav: the last shard alone


@pytest.mark.integration
def test_transformers_loads_the_release_as_the_stages_do(built: Path, models: Models) -> None:
    # The per-expert keys, the prefixes and the config are what transformers' own
    # loader of the whole model reads: both must build the same weights.
    with configs.quiet_transformers():
        whole: Any = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
            built, use_safetensors=True, local_files_only=True, dtype=torch.float32
        )
    for stage, model in zip(weights.STAGES, models, strict=True):
        theirs, ours = getattr(whole, stage).state_dict(), model.state_dict()
        assert theirs.keys() == ours.keys(), stage
        assert all(torch.equal(theirs[k], ours[k]) for k in ours), stage


@pytest.mark.integration
def test_same_seed_same_weights(built: Path, tmp_path: Path) -> None:
    seen: list[tuple[str, int, int]] = []
    weights.build(tmp_path / "again", seed=0, progress=lambda s, d, t: seen.append((s, d, t)))
    weights.build(tmp_path / "other", seed=1)
    assert seen == [("thinker", 1, 3), ("talker", 2, 3), ("code2wav", 3, 3)]
    for stage in weights.STAGES:
        first = weights.load(built, stage).state_dict()
        again = weights.load(tmp_path / "again", stage).state_dict()
        other = weights.load(tmp_path / "other", stage).state_dict()
        assert first.keys() == again.keys()
        assert all(torch.equal(first[k], again[k]) for k in first), stage
        assert any(not torch.equal(first[k], other[k]) for k in first), stage
        assert all(torch.isfinite(t).all() for t in first.values() if t.is_floating_point())


def _code2wav_shard(release: Path) -> Path:
    index = json.loads((release / INDEX).read_text())["weight_map"]
    return release / next(f for n, f in index.items() if n.startswith("code2wav."))


def _rename(release: Path, old: str, new: str) -> None:
    """Rename one code2wav tensor in its shard and in the index, as a release of another
    layout would name it."""
    shard = _code2wav_shard(release)
    tensors = load_file(shard)
    tensors[new] = tensors.pop(old)
    save_file(tensors, shard, metadata={"format": "pt"})
    path = release / INDEX
    index = json.loads(path.read_text())
    index["weight_map"][new] = index["weight_map"].pop(old)
    path.write_text(json.dumps(index))


@pytest.mark.integration
def test_load_refuses_a_release_whose_tensors_do_not_make_the_stage(
    built: Path, tmp_path: Path
) -> None:
    # transformers would fill a missing tensor with fresh random values and only log it;
    # a release of another layout must fail to load, naming what is wrong.
    # A directory of the user's own (no cache's prepared.json) is told what a release
    # holds; one that omni-actors generated, how to rebuild it.
    release = tmp_path / "release"
    shutil.copytree(built, release)
    _rename(release, "code2wav.code_embedding.weight", "code2wav.extra.weight")
    with pytest.raises(ModelFileError, match="is it a Qwen3-Omni release") as failure:
        weights.load(release, "code2wav")
    assert "code2wav.extra.weight" in str(failure.value)
    assert INDEX in str(failure.value)
    (release / "prepared.json").write_text("{}")
    with pytest.raises(ModelFileError, match="prepare tiny-omni --force"):
        weights.load(release, "code2wav")
    (release / "prepared.json").unlink()
    _rename(release, "code2wav.extra.weight", "code2wav.code_embedding.weight")
    weights.load(release, "code2wav")  # whole again
    index = json.loads((release / INDEX).read_text())
    del index["weight_map"]["code2wav.code_embedding.weight"]
    shard = _code2wav_shard(release)
    tensors = load_file(shard)
    del tensors["code2wav.code_embedding.weight"]
    save_file(tensors, shard, metadata={"format": "pt"})
    (release / INDEX).write_text(json.dumps(index))
    with pytest.raises(
        ModelFileError, match=r"lacks tensors of the code2wav: code2wav\.code_embedding\.weight"
    ):
        weights.load(release, "code2wav")


@pytest.mark.integration
def test_thinker_cached_decoding_matches_full_forward(models: Models) -> None:
    thinker, talker, _ = models
    layer = talker.config.accept_hidden_layer
    ids = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(0))
    full = stepping.thinker_forward(
        thinker, ids, DynamicCache(config=thinker.config.text_config), 0, accept_layer=layer
    )

    cache = DynamicCache(config=thinker.config.text_config)
    steps = [stepping.thinker_forward(thinker, ids[:, :16], cache, 0, accept_layer=layer)]
    for pos in range(16, 32):
        steps.append(
            stepping.thinker_forward(thinker, ids[:, pos : pos + 1], cache, pos, accept_layer=layer)
        )
    assert cache.get_seq_length() == 32
    logits = torch.cat([s.logits for s in steps], dim=1)
    hidden = torch.cat([s.accept_hidden for s in steps], dim=1)
    torch.testing.assert_close(logits, full.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden, full.accept_hidden, atol=1e-5, rtol=1e-5)
    assert torch.equal(logits.argmax(-1), full.logits.argmax(-1))
    assert torch.equal(full.embeds, thinker.get_input_embeddings()(ids))


@pytest.mark.integration
def test_audio_encoder_takes_one_second_of_16khz(models: Models) -> None:
    thinker, talker, _ = models
    audio = _one_second()
    assert audio["input_features"].shape == (1, 128, 100)  # 10 ms hop
    n_window = thinker.config.audio_config.n_window
    n_tokens = stepping.audio_token_count(int(audio["feature_attention_mask"].sum()), n_window)
    assert n_tokens == 13  # 100 mel frames -> 13 audio embeddings
    encoded = thinker.get_audio_features(**audio).last_hidden_state
    assert encoded.shape == (n_tokens, thinker.config.text_config.hidden_size)

    ids = torch.tensor(
        [
            [
                Tokens.IM_START,
                Tokens.USER,
                10,
                Tokens.AUDIO_START,
                *[Tokens.AUDIO_PAD] * n_tokens,
                Tokens.AUDIO_END,
            ]
        ]
    )
    cache = DynamicCache(config=thinker.config.text_config)
    step = stepping.thinker_forward(
        thinker, ids, cache, 0, accept_layer=talker.config.accept_hidden_layer, **audio
    )
    assert step.logits.shape == (1, ids.shape[1], thinker.config.text_config.vocab_size)
    assert torch.isfinite(step.logits).all()
    torch.testing.assert_close(step.embeds[0, 4 : 4 + n_tokens], encoded)


@pytest.mark.integration
def test_audio_token_count_is_the_encoder_output_length(models: Models) -> None:
    # Around every chunk boundary (100 mel frames for tiny-omni's n_window of 50) and
    # across several chunks: one placeholder per embedding the encoder really produces.
    thinker = models[0]
    n_window = thinker.config.audio_config.n_window
    for frames in (3, 8, 9, 99, 100, 101, 107, 200, 257, 808):
        features = torch.randn(1, 128, frames)
        mask = torch.ones(1, frames, dtype=torch.long)
        encoded = thinker.get_audio_features(features, mask).last_hidden_state
        assert stepping.audio_token_count(frames, n_window) == encoded.shape[0], frames


@pytest.mark.integration
def test_code2wav_stream_with_left_context_equals_full_decode(models: Models) -> None:
    *_, code2wav = models
    frames, chunk, context = 62, 4, 25
    quantizers = code2wav.config.num_quantizers
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, code2wav.config.codebook_size, (1, quantizers, frames), generator=gen)
    full = code2wav(codes)[:, 0]
    lost = configs.SAMPLES_PER_FRAME * frames - full.shape[-1]
    assert lost == 555  # the transposed convolutions trim 8+5+4+3 steps at rising rates

    pieces, start = [], 0
    while start < frames:
        end, ctx = min(start + chunk, frames), min(context, start)
        pieces.append(stepping.decode_window(code2wav, codes[..., start - ctx : end], ctx))
        start = end
    assert pieces[0].shape[-1] == configs.SAMPLES_PER_FRAME * chunk - lost
    assert all(p.shape[-1] == configs.SAMPLES_PER_FRAME * chunk for p in pieces[1:-1])
    streamed = torch.cat(pieces, dim=-1)
    assert streamed.shape == full.shape
    assert (streamed - full).abs().max().item() < 1e-5
    assert full.abs().max().item() > 1e-2  # audible, not the ~1e-6 of default init

    # HF's own chunked_decode drops the 555-sample tail at every chunk boundary instead.
    hf = code2wav.chunked_decode(codes, chunk_size=chunk, left_context_size=context)
    assert hf.shape[-1] == full.shape[-1] - lost * (-(-frames // chunk) - 1)


@pytest.mark.integration
def test_code2wav_batches_equal_length_windows(models: Models) -> None:
    *_, code2wav = models
    shape = (4, code2wav.config.num_quantizers, 29)
    codes = torch.randint(
        0, code2wav.config.codebook_size, shape, generator=torch.Generator().manual_seed(1)
    )
    batched = stepping.decode_window(code2wav, codes, 25)
    single = torch.cat([stepping.decode_window(code2wav, codes[i : i + 1], 25) for i in range(4)])
    assert batched.shape == (4, configs.SAMPLES_PER_FRAME * 4)
    assert (batched - single).abs().max().item() < 1e-5


@pytest.mark.integration
def test_codec_logit_mask_leaves_codebook_and_eos(models: Models) -> None:
    _, talker, _ = models
    vocab = talker.config.text_config.vocab_size
    codec_eos = talker.config.codec_eos_token_id
    masked = stepping.mask_codec_logits(torch.zeros(2, vocab), vocab, codec_eos)
    allowed = torch.isfinite(masked[0]).nonzero().flatten().tolist()
    assert allowed == [*range(configs.CODEBOOK_SIZE), codec_eos]


@pytest.mark.integration
def test_step_functions_reproduce_hf_generate(models: Models) -> None:
    """Thinker token by token, talker frame by frame == HF's end-to-end greedy generate."""
    thinker, talker, code2wav = models
    with configs.quiet_transformers():
        reference = Qwen3OmniMoeForConditionalGeneration(configs.tiny_configs(0)).eval()
    reference.thinker.load_state_dict(thinker.state_dict())
    reference.talker.load_state_dict(talker.state_dict())
    reference.code2wav.load_state_dict(code2wav.state_dict())

    audio = _one_second(seed=1)
    n_window = thinker.config.audio_config.n_window
    n_audio = stepping.audio_token_count(int(audio["feature_attention_mask"].sum()), n_window)
    system = system_turn("Be brief.")
    user = [Tokens.IM_START, Tokens.USER, 10, Tokens.AUDIO_START, *[Tokens.AUDIO_PAD] * n_audio]
    user += [Tokens.AUDIO_END, *encode("Hi!"), Tokens.IM_END, 10]
    prompt = [*system, *user, *ASSISTANT_OPENING]
    ids = torch.tensor([prompt])
    n_text, n_codes = 8, 12
    sequences, wav = reference.generate(
        ids,
        speaker="ethan",
        thinker_max_new_tokens=n_text,
        thinker_eos_token_id=None,
        talker_max_new_tokens=n_codes,
        talker_do_sample=False,
        talker_repetition_penalty=1.0,
        **audio,
    )

    # Thinker: prefill the prompt, then one token per step; keep each fed token's embedding.
    layer = talker.config.accept_hidden_layer
    cache = DynamicCache(config=thinker.config.text_config)
    prefill = stepping.thinker_forward(thinker, ids, cache, 0, accept_layer=layer, **audio)
    token, generated, fed = stepping.greedy(prefill.logits[:, -1]), [], []
    for pos in range(len(prompt), len(prompt) + n_text):
        generated.append(token)
        if len(generated) == n_text:
            break
        step = stepping.thinker_forward(thinker, token, cache, pos, accept_layer=layer)
        fed.append(step.embeds)
        token = stepping.greedy(step.logits[:, -1])
    assert torch.cat(generated, dim=1).tolist() == sequences[:, len(prompt) :].tolist()

    # Talker: user turn + 9-position assistant prefix, then one frame per step.
    u0, a0 = len(system), len(system) + len(user)
    user_part = stepping.talker_user_part(
        talker,
        prefill.embeds[:, u0:a0],
        prefill.accept_hidden[:, u0:a0],
        ids[:, u0:a0] == Tokens.AUDIO_PAD,
    )
    tts = thinker.get_input_embeddings()(
        torch.tensor([[Tokens.TTS_BOS, Tokens.TTS_EOS, Tokens.TTS_PAD]])
    )
    bos, eos, pad = tts[:, 0:1], tts[:, 1:2], tts[:, 2:3]
    first_four = torch.cat((prefill.embeds[:, a0:], fed[0]), dim=1)
    prefix = stepping.talker_assistant_prefix(
        talker, first_four, (bos, pad), talker.config.speaker_id["ethan"]
    )
    text_inputs = [talker.text_projection(e) for e in [*fed[1:], eos]]
    pad_input = talker.text_projection(pad)

    talker_cache = DynamicCache(config=talker.config.text_config)
    inputs = torch.cat((user_part, prefix), dim=1)
    hidden, logits = stepping.talker_forward(talker, inputs, talker_cache, 0)
    position, frames = inputs.shape[1], []
    vocab, codec_eos = talker.config.text_config.vocab_size, talker.config.codec_eos_token_id
    for step_index in range(n_codes - 1):
        code0 = stepping.greedy(stepping.mask_codec_logits(logits, vocab, codec_eos))
        assert code0.item() != codec_eos
        codes, next_input = stepping.code_predictor_frame(talker, hidden, code0)
        frames.append(codes)
        text = text_inputs[step_index] if step_index < len(text_inputs) else pad_input
        hidden, logits = stepping.talker_forward(talker, next_input + text, talker_cache, position)
        position += 1

    ours = stepping.decode_window(code2wav, torch.stack(frames, dim=-1), 0)
    assert ours.shape == wav[:, 0].shape
    assert torch.equal(ours, wav[:, 0].to(ours.dtype))
