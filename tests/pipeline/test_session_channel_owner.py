"""``SessionChannel`` is the one owner of a session's shared state.

Both sides of a session (the caller's ``Session``/``SessionInput``/``Response`` and the
session's actor) change it only through the channel's methods, so what changes it can
be read in ``session_channel.py`` alone. Read from the source with ``ast``: an
assignment to a channel's attribute (or to an item of one) anywhere else fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

from source_syntax import parse

ROOT = Path(__file__).resolve().parents[2]
OWNER = ROOT / "omni_actors" / "pipeline" / "session_channel.py"


def _channel_writes(path: Path) -> list[str]:
    """``file:line`` of each assignment to ``<...>channel.<attr>`` or an item of it."""
    found = []
    tree = parse(path)
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        for target in targets:
            while isinstance(target, ast.Subscript):  # channel.starts[0] = ...
                target = target.value
            if not isinstance(target, ast.Attribute):
                continue
            owner = target.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name == "channel":
                found.append(f"{path}:{node.lineno}")
    return found


def test_only_the_channel_writes_its_state() -> None:
    paths = [
        path
        for top in ("omni_actors", "actors")
        for path in sorted((ROOT / top).rglob("*.py"))
        if path != OWNER and not path.is_relative_to(ROOT / "omni_actors" / "actors")
    ]
    assert len(paths) > 100
    assert [write for path in paths for write in _channel_writes(path)] == []


def test_the_rule_sees_attribute_and_item_writes(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "self.channel.stale = 'x'\nchannel.starts[0] = 1.0\nself.channel.n += 1\n"
        "self.channel.put(e)\nx = channel.stale\nself.other.stale = ''\n"
    )
    found = _channel_writes(probe)
    assert [f.rsplit(":", 1)[1] for f in found] == ["1", "2", "3"]
