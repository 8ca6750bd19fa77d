"""``ThinkerModel``: the loaded thinker and every forward the thinker engine runs.

Everything here runs in the engine's model thread (``TorchEngine.call``), one call at a
time, on one session's :class:`~.conversation.Conversation` and the
:class:`~.user_turn.UserTurn` it is receiving: the engine's event-loop side decides
*what* to run, this runs it and keeps the cache position, the carry and the turn's rows
in step with what the cache holds. Decode steps are the exception:
:meth:`ThinkerModel.decode_steps` feeds the last token of several sessions in one forward,
over a static slot cache when the model has one (:mod:`.static_decode`): a session's
newest positions may then be in its slot, and every other forward over its cache settles
them into it first (:meth:`ThinkerModel.settle`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, cast

import torch

from omni_actors.actors.engines.qwen3_omni import configs, layout, stepping, weights
from omni_actors.actors.engines.qwen3_omni.audio_stream import AudioClip
from omni_actors.actors.engines.qwen3_omni.batched_step import thinker_steps
from omni_actors.actors.engines.qwen3_omni.conversation import Conversation, ThinkerReply
from omni_actors.actors.engines.qwen3_omni.hf import (
    PreTrainedConfig,
    Qwen3OmniMoeThinkerForConditionalGeneration,
    WhisperFeatureExtractor,
)
from omni_actors.actors.engines.qwen3_omni.log_mel import LogMel
from omni_actors.actors.engines.qwen3_omni.sampling import Sampling, pick
from omni_actors.actors.engines.qwen3_omni.static_decode import StaticDecoder, StaticPlan, StepCache
from omni_actors.actors.engines.qwen3_omni.user_turn import Feed, UserTurn
from omni_actors.actors.engines.qwen3_omni.vocabulary import Vocabulary
from omni_actors.errors import ModelFileError
from omni_actors.models.files import read_json
from omni_actors.models.release import Release

__all__ = ["DecodeStep", "ThinkerModel", "Token"]

_PREPROCESSOR: Final = "preprocessor_config.json"

Token = tuple[int, torch.Tensor]
"""A picked token and its [1, H] input embedding."""


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """One session's next decode step: feed ``token``, pick the next one."""

    conversation: Conversation
    token: int
    allow_end: bool
    sampling: Sampling


class ThinkerModel:
    """The thinker of a release, loaded (in the model thread).

    Args:
        path: the release directory (:mod:`.weights`).
        allowed_token_ranges: half-open ``[start, stop)`` id ranges a reply may use
            (``<|im_end|>`` is allowed once the reply's minimum is reached); None: any.
            For random weights, which would otherwise pick ids no reader could show.
        static: decode over a static slot cache so built; None: every step eagerly
            over the sessions' own caches.

    Raises:
        ModelFileError: a file of the stage, its tokenizer or front end, or the composite
            ``config.json`` beside it, is missing or corrupt (see :func:`.weights.load`
            and :meth:`.Vocabulary.load`).
        ValueError: a range of ``allowed_token_ranges`` is empty or outside the
            vocabulary.

    Attributes:
        text_config: the text model's config (what a session's ``DynamicCache`` needs).
        vocabulary: the release's tokenizer and special ids.
        tts: [3, H] the embeddings of TTS_BOS, TTS_EOS, TTS_PAD.
        opening: [3, H] the embeddings of ``<|im_start|> assistant \\n``.
    """

    def __init__(
        self,
        path: Path,
        device: torch.device | None = None,
        *,
        allowed_token_ranges: list[tuple[int, int]] | None = None,
        static: StaticPlan | None = None,
    ) -> None:
        device = device or torch.device("cpu")
        release = Release.open(path, remedy=layout.REBUILD)
        thinker = weights.load(path, "thinker", device=device, release=release)
        assert isinstance(thinker, Qwen3OmniMoeThinkerForConditionalGeneration)
        self._thinker = thinker
        self._accept_layer = layout.accept_hidden_layer(release.config, path / "config.json")
        # After the config's own checks: AutoTokenizer reads config.json too, and would
        # blame the directory for a config it cannot parse.
        self.vocabulary = vocabulary = Vocabulary.load(path)
        ids = vocabulary.ids
        self.text_config = cast(PreTrainedConfig, thinker.config.text_config)
        audio = cast(PreTrainedConfig, thinker.config.audio_config)
        self._n_window, self._n_window_infer = int(audio.n_window), int(audio.n_window_infer)
        # Annotated from transformers 5.23 on, untyped before: the ignore serves the
        # older releases of the supported range and is unused on newer ones.
        self._embedding = thinker.get_input_embeddings()  # type: ignore[no-untyped-call,unused-ignore]
        self._extractor = _feature_extractor(path)
        vocab = int(self.text_config.vocab_size)
        with torch.device(device):
            if allowed_token_ranges is None:
                self._allow_text = torch.zeros(vocab)
            else:
                self._allow_text = torch.full((vocab,), float("-inf"))
                for start, stop in allowed_token_ranges:
                    if not 0 <= start < stop <= vocab:
                        raise ValueError(
                            f"allowed_token_ranges has [{start}, {stop}), which is empty or "
                            f"outside the thinker's vocabulary [0, {vocab})"
                        )
                    self._allow_text[start:stop] = 0.0
            self._allow_end = self._allow_text.clone()
            self._allow_text[ids.im_end] = float("-inf")
            self._allow_end[ids.im_end] = 0.0
            self._allow = torch.stack((self._allow_text, self._allow_end))
            # No graph: weights.load turned gradients off.
            tts = torch.tensor([ids.tts_bos, ids.tts_eos, ids.tts_pad])
            self.tts = self._embedding(tts)
            self.opening = self._embedding(torch.tensor(vocabulary.assistant_opening))
        self._static: StaticDecoder | None = None
        if static is not None:
            self._static = StaticDecoder(
                thinker.model,
                self.text_config,
                self._static_step,
                slots=static.slots,
                max_len=static.max_len,
                device=device,
                dtype=self.tts.dtype,
                graphs=static.graphs,
                name="thinker decode",
            )
            if static.warm:
                self._static.warm([((1,), torch.long)])

    def clip(self) -> AudioClip:
        """A new audio clip, windowed as this thinker's audio encoder attends."""
        mel = LogMel(self._extractor, block=2 * self._n_window)
        return AudioClip(mel, self._n_window, self._n_window_infer)

    def prefill(
        self,
        conversation: Conversation,
        turn: UserTurn,
        end_clip: bool,
        then: list[int],
        tail: int = 0,
    ) -> None:
        """Prefill the turn's pending ids, its clip's new windows (all of the clip if
        ``end_clip``), then ``then``, whose last ``tail`` ids are not the user's."""
        embeds = None
        if turn.clip is not None:
            clip, encode = turn.clip, self._encode
            embeds = clip.finish(encode) if end_clip else clip.windows(encode)
        if embeds is None and not end_clip and not then:
            return  # the clip's log-mel advanced, no window is whole yet
        feed = turn.next_feed(embeds, end_clip, then, tail)
        if feed.ids:
            self.feed(conversation, turn, feed)

    @torch.no_grad()
    def feed(self, conversation: Conversation, turn: UserTurn, feed: Feed) -> stepping.ThinkerStep:
        """One forward over ``feed``; its talker rows go to the turn.

        Rows: the input embedding per position, the ``accept_hidden_layer`` state at
        AUDIO_PAD positions (``stepping.talker_user_part`` selects between the two by the
        placeholder mask, so one tensor carries what it needs).
        """
        step = self._forward(conversation, feed.ids, feed.audio)
        if feed.skip:
            conversation.carry = []
        placeholders = torch.tensor(feed.ids) == self.vocabulary.ids.audio_pad
        rows = torch.where(placeholders[:, None], step.accept_hidden[0], step.embeds[0])
        turn.keep(feed, rows, placeholders)
        return step

    @torch.no_grad()
    def instruct(self, conversation: Conversation, system: tuple[int, ...]) -> None:
        """Feed the system turn ``system`` behind the carry (no user turn is open)."""
        self._forward(conversation, [*conversation.carry, *system])
        conversation.carry = []
        conversation.system = (*conversation.system, *system)

    @torch.no_grad()
    def take_reply(self, conversation: Conversation, tokens: tuple[int, ...]) -> None:
        """Take ``tokens`` into the conversation as the assistant's turn, as if decoded.

        One forward over the carry, ``<|im_start|> assistant \\n`` and the tokens; the turn
        is then left as a completed reply leaves it (``<|im_end|> \\n`` in the carry, a
        :class:`ThinkerReply` a truncation can cut, no user turn or system turn after it).

        The cache holds the same positions as after decoding, but computed in one
        forward of ``len(tokens) + 3`` rows instead of one per token: its keys and values
        may differ from the decoded ones in the last bits (other matmul shapes, as in a
        batched decode step), so a later greedy pick can only change on a near tie.
        """
        opening = self.vocabulary.assistant_opening
        self._forward(conversation, [*conversation.carry, *opening, *tokens])
        conversation.carry = [*self.vocabulary.close_turn]
        conversation.reply = ThinkerReply(conversation.position - len(tokens), tokens, len(tokens))
        conversation.turns_since_reply, conversation.system = 0, ()

    @torch.no_grad()
    def open_reply(
        self, conversation: Conversation, turn: UserTurn | None, sampling: Sampling
    ) -> Token:
        """Close ``turn`` if one is open, open the reply, pick its first token.

        One forward over what the turn still has pending (its clip's last window among
        it), ``<|im_end|> \\n``, the system turn set while it was open if any, then
        ``<|im_start|> assistant \\n``: the only work left between the end of the input
        and the first token. Without a turn it feeds the carry and the opening.
        """
        opening = self.vocabulary.assistant_opening
        if turn is None:
            step = self._forward(conversation, [*conversation.carry, *opening])
            conversation.carry = []
        else:
            embeds = None if turn.clip is None else turn.clip.finish(self._encode)
            then = [*self.vocabulary.close_turn, *turn.system, *opening]
            tail = len(turn.system) + len(opening)
            step = self.feed(conversation, turn, turn.next_feed(embeds, True, then, tail))
        return self._pick(step.logits[0, -1], sampling.min_tokens == 0, sampling)

    @torch.no_grad()
    def decode(
        self, conversation: Conversation, token: int, allow_end: bool, sampling: Sampling
    ) -> Token:
        """Feed ``token``, pick the next one: one forward over the session's own cache
        (what it decoded in a static slot settled into it first), exactly transformers'
        one-session step."""
        step = self._forward(conversation, [token])
        return self._pick(step.logits[0, -1], allow_end, sampling)

    @torch.no_grad()
    def decode_steps(self, steps: list[DecodeStep], *, eager: bool = False) -> list[Token]:
        """:meth:`decode` for several sessions in one forward; each picks with its own
        sampling and generator.

        Over the static cache when there is one and the sessions fit it; else their
        caches left-padded (:mod:`.batched_step`), and one session runs :meth:`decode`
        itself, so a session decoding alone is exact. ``eager`` takes the second way
        even with a static cache (a benchmark compares the two).
        """
        conversations = [step.conversation for step in steps]
        lengths = [conversation.position for conversation in conversations]
        if not eager and self._static is not None and self._static.fits(lengths):
            caches = [conversation.cache for conversation in conversations]
            ids = torch.tensor([[step.token] for step in steps])
            (logits,) = self._static.run(caches, lengths, [ids])
            for conversation in conversations:
                conversation.position += 1
            return self._pick_rows(logits, steps)
        for conversation in conversations:
            self.settle(conversation)
        if len(steps) == 1:
            (one,) = steps
            return [self.decode(one.conversation, one.token, one.allow_end, one.sampling)]
        logits = thinker_steps(
            self._thinker,
            torch.tensor([[step.token] for step in steps]),
            [conversation.cache for conversation in conversations],
            [conversation.position for conversation in conversations],
        )
        for conversation in conversations:
            conversation.position += 1
        return [
            self._pick(row, step.allow_end, step.sampling)
            for row, step in zip(logits, steps, strict=True)
        ]

    @property
    def static(self) -> StaticDecoder | None:
        """The static slot cache decode steps run over, if any."""
        return self._static

    def settle(self, conversation: Conversation) -> None:
        """Move what ``conversation`` decoded in its static slot into its own cache (a
        no-op without a static cache or a slot): before anything else reads or crops it."""
        if self._static is not None:
            self._static.settle(conversation.cache)

    def _static_step(
        self, cache: StepCache, positions: torch.Tensor, ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """The static decode step: logits [B, vocab] of each row's next token."""
        out = self._thinker.model(
            input_ids=ids,
            attention_mask=cache.mask,
            position_ids=positions[:, None],
            past_key_values=cache,
            use_cache=True,
        )
        return (self._thinker.lm_head(out.last_hidden_state[:, -1]),)

    def _pick_rows(self, logits: torch.Tensor, steps: list[DecodeStep]) -> list[Token]:
        """Each row's token and embedding: the greedy rows in one pass (one read back
        to the host), the sampled ones each with its own generator."""
        ends = torch.tensor([step.allow_end for step in steps], device=logits.device)
        masked = logits.float() + self._allow[ends.long()]
        tokens = masked.argmax(dim=-1).tolist()
        for row, step in enumerate(steps):
            if step.sampling.temperature > 0:
                allowed = self._allow_end if step.allow_end else self._allow_text
                tokens[row] = pick(logits[row], allowed, step.sampling)
        embeds = self._embedding(torch.tensor(tokens, device=logits.device))
        return [(token, embeds[row : row + 1]) for row, token in enumerate(tokens)]

    def _encode(self, mel: torch.Tensor) -> torch.Tensor:
        return stepping.encode_audio(self._thinker, mel)

    def _forward(
        self, conversation: Conversation, ids: list[int], audio: torch.Tensor | None = None
    ) -> stepping.ThinkerStep:
        self.settle(conversation)
        step = stepping.thinker_forward(
            self._thinker,
            torch.tensor([ids]),
            conversation.cache,
            conversation.position,
            accept_layer=self._accept_layer,
            audio_embeds=audio,
        )
        conversation.position += len(ids)
        return step

    def _pick(self, logits: torch.Tensor, allow_end: bool, sampling: Sampling) -> Token:
        """An allowed token (or im_end) and its [1, H] embedding."""
        token = pick(logits, self._allow_end if allow_end else self._allow_text, sampling)
        return token, self._embedding(torch.tensor([token]))


def _feature_extractor(path: Path) -> WhisperFeatureExtractor:
    """The release's mel front end, from its ``preprocessor_config.json``.

    Read and checked first: ``from_pretrained`` would report a broken file without
    naming it, and a missing one by looking for it on the Hub.
    """
    file = path / _PREPROCESSOR
    read_json(file, remedy=layout.REBUILD)
    try:
        with configs.quiet_transformers():
            extractor = WhisperFeatureExtractor.from_pretrained(str(path), local_files_only=True)
    except Exception as error:  # the file parsed, yet is no Whisper extractor's config
        problem = f"is no WhisperFeatureExtractor config ({error})"
        raise ModelFileError(file, problem, layout.REBUILD) from error
    assert isinstance(extractor, WhisperFeatureExtractor)
    return extractor
