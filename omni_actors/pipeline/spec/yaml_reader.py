"""A pipeline file's YAML, read within bounds.

A pipeline definition is a few KB: a few levels deep, a few hundred values, an alias or
two. YAML says far more in few bytes: aliases that repeat aliases ("billion laughs": a
few hundred bytes that expand to billions of values), nesting that ends PyYAML's
recursive composer in a ``RecursionError`` and libyaml's in a crash of the process
(100,000 ``[``), a base-60 integer (``1:2:3:...``) that
PyYAML reads in time quadratic in its length, scalars whose constructors raise
``ValueError``, ``KeyError`` or ``AttributeError``. This module refuses all of that
before it is built, so reading a pipeline costs time and memory in proportion to the
limits below, and every failure is a :class:`yaml.YAMLError` that says where:

- a file is read up to :data:`MAX_PIPELINE_BYTES`;
- the event stream is walked first, building nothing: no collection may nest deeper
  than :data:`MAX_DEPTH`, no more than :data:`MAX_ALIASES` aliases may be used, and the
  document, each alias counted as the values it repeats, holds at most
  :data:`MAX_NODES` values (so whatever later walks the data, pydantic included, walks
  at most that many);
- only then is it composed and constructed with PyYAML's safe schema, where a value
  that cannot be read (an integer past Python's limit on reading one from its digits,
  ``2001-02-30``, ``!!bool maybe``) is a ``ConstructorError`` at its line and column.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import Node, ScalarNode

__all__ = [
    "MAX_ALIASES",
    "MAX_DEPTH",
    "MAX_NODES",
    "MAX_PIPELINE_BYTES",
    "YamlLimitError",
    "parse_yaml",
    "read_limited",
]

MAX_PIPELINE_BYTES = 1 << 20
"""The largest pipeline file read (1 MiB): a definition is a few KB, a generated one of a
thousand stages about 80 KB."""

MAX_DEPTH = 32
"""How deeply collections may nest: a pipeline needs five levels, an engine's arguments a
few more; far below the depth that exhausts the composer's stack (Python's recursion
limit; libyaml's C stack)."""

MAX_ALIASES = 64
"""How many aliases (``*name``) a file may use: a pipeline needs a few, if any."""

MAX_NODES = 50_000
"""How many values (scalars and collections, an alias counted as the values it repeats)
a document may hold: a pipeline has a few hundred, one of a thousand stages about 14,000."""

# YAML 1.1 base-60 integers (``1:30:00``) are read by repeated bigint multiplication:
# one of 1 MB takes 100 s. A real one is a time of day.
_MAX_BASE60_CHARS = 64
_INT_TAG = "tag:yaml.org,2002:int"

# libyaml reads 1 MiB of YAML in about a second; PyYAML's pure-Python scanner in 26.
_PARSER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


class YamlLimitError(yaml.MarkedYAMLError):
    """A pipeline file's text is past one of this module's limits; the message names the
    limit and, where the text has one, the line and column."""


def read_limited(path: Path) -> bytes:
    """The bytes of the file at ``path``, refused past :data:`MAX_PIPELINE_BYTES`.

    Raises:
        OSError: the file cannot be read.
        YamlLimitError: the file is larger than the limit; the message gives its size.
    """
    with path.open("rb") as stream:
        # One byte past the limit and no further: a device or a pipe reports no size.
        raw = stream.read(MAX_PIPELINE_BYTES + 1)
        if len(raw) > MAX_PIPELINE_BYTES:
            size = os.fstat(stream.fileno()).st_size
            found = (
                f"{size:,}" if size > MAX_PIPELINE_BYTES else f"more than {MAX_PIPELINE_BYTES:,}"
            )
            raise YamlLimitError(
                problem=f"the file has {found} bytes; a pipeline file may have at most "
                f"{MAX_PIPELINE_BYTES:,} bytes (MAX_PIPELINE_BYTES): a definition is a few KB"
            )
    return raw


def parse_yaml(text: bytes | str) -> Any:
    """The data of the one YAML document in ``text`` (safe schema), within the limits.

    Bytes are decoded as YAML says (UTF-8, or UTF-16 with a byte-order mark).

    Raises:
        YamlLimitError: past a limit; the message names it and where.
        yaml.YAMLError: not YAML, or a value that cannot be read, with its position.
    """
    _check_events(text)
    node = yaml.compose(text, Loader=_PARSER)
    return None if node is None else _Constructor().construct_document(node)


@dataclass(slots=True)
class _Open:
    """A collection whose end the walk has not reached yet."""

    anchor: str | None
    values: int = 1  # itself, then each value inside as it ends


_TOO_DEEP = (
    f"collections nest deeper than {MAX_DEPTH} levels (MAX_DEPTH); a pipeline needs a handful"
)


def _check_events(text: bytes | str) -> None:
    """Walk ``text``'s events, refusing it at the first limit it passes."""
    try:
        _walk_events(text)
    except YamlLimitError:
        raise
    except yaml.MarkedYAMLError as exc:
        # libyaml 0.2.6 (PyYAML 6.0.4's) stops at 1,000 levels while scanning ahead,
        # before the first event reaches the walk: the same limit, said our way.
        if "maximum nesting depth" not in str(exc.problem):
            raise
        raise YamlLimitError(problem=_TOO_DEEP, problem_mark=exc.problem_mark) from None


def _walk_events(text: bytes | str) -> None:
    anchors: dict[str, int] = {}  # each anchor's values, aliases inside it expanded
    open_: list[_Open] = []
    aliases = 0
    for event in yaml.parse(text, Loader=_PARSER):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(open_) == MAX_DEPTH:
                raise _refused(_TOO_DEEP, event)
            open_.append(_Open(event.anchor))
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            ended = open_.pop()
            anchor, values = ended.anchor, ended.values
        elif isinstance(event, yaml.ScalarEvent):
            anchor, values = event.anchor, 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise _refused(
                    f"more than {MAX_ALIASES} aliases (MAX_ALIASES); a pipeline needs a few: "
                    "write the values out",
                    event,
                )
            if any(o.anchor == event.anchor for o in open_):
                raise _refused(
                    f"alias *{event.anchor} repeats a collection it is inside: a recursive "
                    "structure, which a pipeline cannot be",
                    event,
                )
            # An undefined alias counts one; composing the document then refuses it.
            anchor, values = None, anchors.get(event.anchor or "", 1)
        else:
            if isinstance(event, yaml.DocumentStartEvent):
                anchors.clear()  # anchors are a document's own
            continue
        if anchor is not None:
            anchors[anchor] = values
        # Each collection's count is checked as it grows, so the walk stops at the first
        # value past the limit, never after expanding anything.
        if (open_[-1].values if open_ else 0) + values > MAX_NODES:
            raise _refused(
                f"the document holds more than {MAX_NODES:,} values, aliases counted as the "
                "values they repeat (MAX_NODES); a pipeline has a few hundred",
                event,
            )
        if open_:
            open_[-1].values += values


def _refused(problem: str, event: yaml.Event) -> YamlLimitError:
    """The error for ``problem``, at ``event``'s position (libyaml's marks converted)."""
    mark = event.start_mark
    where = (
        None if mark is None else yaml.Mark(mark.name, mark.index, mark.line, mark.column, None, 0)
    )
    return YamlLimitError(problem=problem, problem_mark=where)


class _Constructor(SafeConstructor):
    """PyYAML's safe schema; a value it cannot read is a ``ConstructorError`` saying where."""

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        text = node.value if isinstance(node, ScalarNode) else ""
        if node.tag == _INT_TAG and ":" in text and len(text) > _MAX_BASE60_CHARS:
            raise ConstructorError(
                None,
                None,
                f"a base-60 integer of {len(text):,} characters; at most "
                f"{_MAX_BASE60_CHARS} are read",
                node.start_mark,
            )
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except Exception as exc:
            # PyYAML's scalar constructors raise whatever their parsing raises: ValueError
            # (``2001-02-30``, ``!!int x``), KeyError (``!!bool maybe``), AttributeError
            # (``!!timestamp x``), IndexError (``!!int ''``).
            digits = sys.get_int_max_str_digits()
            if node.tag == _INT_TAG and digits and len(text) > digits:
                problem = f"an integer of {len(text):,} characters; Python reads at most {digits:,}"
            else:
                shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text):,} characters)"
                problem = f"cannot read {shown!r} as {node.tag}: {exc}"
            raise ConstructorError(None, None, problem, node.start_mark) from None
