"""``Vocabulary``: a release's tokenizer and every special id the engines feed or watch.

Nothing about the text vocabulary is assumed: the tokenizer is the release's own
(``AutoTokenizer`` over its files, each checked first as hostile input), the special ids
come from the composite ``config.json`` (where Qwen3-Omni and HF's end-to-end model read
them), and the chat turns are what the release's chat template renders. The engines
build a turn from pieces (a user turn is prefilled while it arrives), so the pieces are
checked once against the template: the ids ``<|im_start|>user\\n`` renders to must be
``im_start``, ``user_token_id`` and the newline, or the config and the tokenizer
disagree, which would condition the talker on the wrong turns without any error.

A text chunk is encoded on its own (a streamed prefill cannot take back tokens already
in the cache), so a BPE merge across two chunks of one turn does not happen; text sent
in one chunk encodes as the template's rendering does. Special-token strings inside the
user's text stay text (``split_special_tokens``): a user cannot close a turn by typing
``<|im_end|>``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from omni_actors.actors.engines.qwen3_omni.detokenizer import Detokenizer
from omni_actors.errors import ModelFileError
from omni_actors.models.files import load_tokenizer, read_json

__all__ = ["SpecialIds", "Vocabulary"]

_REMEDY: Final = (
    "use a release whose tokenizer files and config.json come from the same model "
    "(omni-actors prepare tiny-omni --force rebuilds tiny-omni)"
)
_TOP_LEVEL: Final = {
    "im_start": ("im_start_token_id", "<|im_start|>"),
    "im_end": ("im_end_token_id", "<|im_end|>"),
    "tts_pad": ("tts_pad_token_id", "<tts_pad>"),
    "tts_bos": ("tts_bos_token_id", "<tts_text_bos>"),
    "tts_eos": ("tts_eos_token_id", "<tts_text_eod>"),
}
"""Special ids of the composite config: attribute -> (config key, the token's name)."""
_THINKER: Final = {
    "audio_pad": ("audio_token_id", "<|audio_pad|>"),
    "audio_start": ("audio_start_token_id", "<|audio_start|>"),
    "audio_end": ("audio_end_token_id", "<|audio_end|>"),
}
"""Special ids of ``thinker_config``; a config may lack ``audio_end_token_id`` (Qwen's
does), which then comes from the tokenizer."""
_ROLES: Final = ("system", "user", "assistant")
# Characters from which a text is encoded in a worker thread: a thread hop costs tens of
# microseconds, a 2500-token prompt about 6 ms (the tokenizer lets go of the GIL).
_APART_CHARS: Final = 2048
_TEMPLATE_FILES: Final = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")


@dataclass(frozen=True)
class SpecialIds:
    """The ids the engines place themselves (module docstring)."""

    im_start: int
    im_end: int
    newline: int
    system: int
    user: int
    assistant: int
    tts_pad: int
    tts_bos: int
    tts_eos: int
    audio_pad: int
    """Placeholder replaced by one audio-encoder output each."""
    audio_start: int
    audio_end: int


class Vocabulary:
    """A release's text vocabulary: encoding, streamed decoding and the chat turns.

    Build with :meth:`load`.

    Attributes:
        tokenizer: the release's ``transformers`` tokenizer, its chat template set.
        ids: the special ids.
        size: ids the tokenizer knows (the thinker's vocabulary may be larger).
    """

    def __init__(self, tokenizer: Any, ids: SpecialIds) -> None:
        self.tokenizer = tokenizer
        self.ids = ids
        self.size = len(tokenizer)
        self._text_ids: tuple[int, ...] | None = None

    @classmethod
    def load(cls, release_dir: Path) -> Vocabulary:
        """The vocabulary of the release in ``release_dir``.

        Raises:
            ModelFileError: a tokenizer file or ``config.json`` is missing or corrupt, a
                special id of the config is not the tokenizer's token of that name, or
                the chat template renders the turns with other ids than the config's.
        """
        release_dir = Path(release_dir)
        config_path = release_dir / "config.json"
        config = read_json(config_path, remedy=_REMEDY)
        _check_id_types(config, config_path)  # before AutoTokenizer, which parses the config
        tokenizer = load_tokenizer(release_dir, remedy=_REMEDY)
        template_file = _set_chat_template(tokenizer, release_dir)
        newline = tokenizer.encode("\n", add_special_tokens=False)
        if len(newline) != 1:
            problem = f'encodes "\\n" as {newline}, not one token'
            raise ModelFileError(release_dir / "tokenizer.json", problem, _REMEDY)
        found: dict[str, int] = {"newline": newline[0]}
        thinker = config.get("thinker_config")
        thinker = thinker if isinstance(thinker, dict) else {}
        for part, keys, where in ((config, _TOP_LEVEL, ""), (thinker, _THINKER, "thinker_config.")):
            for name, (key, token) in keys.items():
                found[name] = _special_id(tokenizer, part, key, token, config_path, where)
        rendered = _rendered_roles(tokenizer, template_file, found)
        for role in _ROLES:
            key = f"{role}_token_id"
            value = config.get(key)
            if value != rendered[role]:
                problem = (
                    f"has {key} {value!r}, but the chat template in {template_file.name} "
                    f"renders the {role} role as id {rendered[role]}"
                )
                raise ModelFileError(config_path, problem, _REMEDY)
            found[role] = rendered[role]
        return cls(tokenizer, SpecialIds(**found))

    # -- the chat turns ------------------------------------------------------------------

    @property
    def close_turn(self) -> tuple[int, ...]:
        """``<|im_end|>\\n``: what ends every turn."""
        return (self.ids.im_end, self.ids.newline)

    @property
    def user_opening(self) -> tuple[int, ...]:
        """``<|im_start|>user\\n``."""
        return (self.ids.im_start, self.ids.user, self.ids.newline)

    @property
    def assistant_opening(self) -> tuple[int, ...]:
        """``<|im_start|>assistant\\n``: what opens a reply."""
        return (self.ids.im_start, self.ids.assistant, self.ids.newline)

    @property
    def system_opening(self) -> tuple[int, ...]:
        """``<|im_start|>system\\n``."""
        return (self.ids.im_start, self.ids.system, self.ids.newline)

    def system_turn(self, text: str) -> tuple[int, ...]:
        """The ids of the system turn that sets ``text`` as the instructions; none for
        ``""`` (no instructions: nothing to prefill)."""
        if not text:
            return ()
        return (*self.system_opening, *self.encode(text), *self.close_turn)

    # -- text ----------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """``text``'s ids, special-token strings in it kept as text (module docstring)."""
        ids: list[int] = self.tokenizer.encode(
            text, add_special_tokens=False, split_special_tokens=True
        )
        return ids

    async def encode_apart(self, text: str) -> list[int]:
        """:meth:`encode`, in a worker thread if ``text`` is long: the event loop (and a
        model thread launching a step) go on meanwhile, and the prompts of a wave are
        encoded side by side, not one after another on the loop."""
        if len(text) < _APART_CHARS:
            return self.encode(text)
        return await asyncio.to_thread(self.encode, text)

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``, special tokens skipped."""
        text: str = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text

    def text_ids(self) -> tuple[int, ...]:
        """The ids that are text of their own: no added (special) token, and each one's
        text encodes back to that id alone, so it is whole characters (not a byte of
        one) that encoding does produce (not a filler no text encodes to). Random text
        of a given length is drawn from these (``bench pipeline --input-tokens``).
        Computed once, in one batch over the vocabulary."""
        if self._text_ids is None:
            added = set(self.tokenizer.added_tokens_decoder)
            ids = [i for i in range(self.size) if i not in added]
            texts = self.tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=True)
            encoded = self.tokenizer(texts, add_special_tokens=False, split_special_tokens=True)
            self._text_ids = tuple(
                i for i, back in zip(ids, encoded["input_ids"], strict=True) if back == [i]
            )
        return self._text_ids

    def detokenizer(self) -> Detokenizer:
        """A new reply's incremental decoding."""
        return Detokenizer(self.tokenizer)


def _set_chat_template(tokenizer: Any, release_dir: Path) -> Path:
    """Give ``tokenizer`` the release's chat template; the file it came from.

    ``AutoTokenizer`` reads a template from ``tokenizer_config.json`` or
    ``chat_template.jinja``; Qwen's releases keep it in ``chat_template.json``, which only
    processors read.
    """
    for name in _TEMPLATE_FILES:
        path = release_dir / name
        if not path.is_file():
            continue
        if name == "chat_template.jinja":
            template: object = path.read_text(encoding="utf-8", errors="strict")
        else:
            template = read_json(path, remedy=_REMEDY).get("chat_template")
        if isinstance(template, str) and template:
            tokenizer.chat_template = template
            return path
        if name == "chat_template.json":
            raise ModelFileError(path, "has no chat_template string", _REMEDY)
    raise ModelFileError(release_dir / "chat_template.json", "is missing", _REMEDY)


def _check_id_types(config: Mapping[str, Any], path: Path) -> None:
    """Every special id the config must hold is an int (ids checked against names later)."""
    thinker = config.get("thinker_config")
    thinker = thinker if isinstance(thinker, dict) else {}
    parts = ((config, _TOP_LEVEL, ""), (thinker, _THINKER, "thinker_config."))
    keys = [(part, key, where) for part, names, where in parts for key, _ in names.values()]
    keys += [(config, f"{role}_token_id", "") for role in _ROLES]
    for part, key, where in keys:
        if key == "audio_end_token_id" and key not in part:
            continue  # Qwen's config lacks it: the tokenizer's <|audio_end|>
        value = part.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ModelFileError(path, f"has no {where}{key} id (found {value!r})", _REMEDY)


def _special_id(
    tokenizer: Any, part: Mapping[str, Any], key: str, token: str, path: Path, where: str
) -> int:
    """The id ``part[key]`` (from ``path``), checked against the tokenizer's ``token``."""
    known = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(known, int) or tokenizer.convert_ids_to_tokens(known) != token:
        known = None  # the tokenizer has no such token
    value = part.get(key, known if key == "audio_end_token_id" else None)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ModelFileError(path, f"has no {where}{key} id (found {value!r})", _REMEDY)
    if value != known:
        problem = f"has {where}{key} {value}, but the tokenizer's {token} is {known}"
        raise ModelFileError(path, problem, _REMEDY)
    return value


def _rendered_roles(tokenizer: Any, template_file: Path, ids: Mapping[str, int]) -> dict[str, int]:
    """The id each role renders to: the template's turns, encoded, must be
    ``<|im_start|> role \\n <|im_end|> \\n`` with the role one token."""
    roles: dict[str, int] = {}
    for role in _ROLES:
        messages = [{"role": role, "content": ""}]
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False)
        except Exception as error:  # the template is the file's: any failure is its fault
            problem = f"holds a chat template that does not render a {role} turn ({error})"
            raise ModelFileError(template_file, problem, _REMEDY) from error
        rendered = tokenizer.encode(str(text), add_special_tokens=False)
        frame = [ids["im_start"], ids["newline"], ids["im_end"], ids["newline"]]
        if len(rendered) != 5 or [rendered[0], *rendered[2:]] != frame:
            problem = (
                f"renders a {role} turn as {text!r} = ids {rendered}, not "
                f"<|im_start|>{role}\\n<|im_end|>\\n with the role one token"
            )
            raise ModelFileError(template_file, problem, _REMEDY)
        roles[role] = rendered[1]
    return roles
