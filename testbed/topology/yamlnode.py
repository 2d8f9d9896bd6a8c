"""A user's YAML file read into typed nodes: the one reader behind every YAML file a user
gives (topologies, image recipes, placement blocks).

It composes nodes and never constructs objects (no custom tags, bounded depth and list
length), and every accessor raises ConfigError naming the file, the field's path and the
line, so a mistake is one line, never a traceback. Nothing here knows what a topology is.
"""
from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from testbed.errors import ConfigError, one_line

#: A topology file larger than this is refused unread (a real one is a few KB).
MAX_FILE_BYTES = 256 << 10
#: Tags a topology may use: YAML's plain types. Custom tags (!env, !!python/...) are refused.
PLAIN_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float", "str", "timestamp")}
MAP_TAG, SEQ_TAG = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"

#: A topology is at most five levels deep; deeper nesting is refused while composing, long
#: before PyYAML's recursive composer would hit Python's recursion limit.
MAX_DEPTH = 32
MAX_LIST = 1000


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, used only to compose nodes, with a bound on nesting."""

    _depth = 0

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class Node:
    """A YAML node plus where it came from, with typed accessors that raise ConfigError."""

    def __init__(self, file: str, node: yaml.Node, path: str) -> None:
        self.file, self.node, self.path = file, node, path

    @property
    def line(self) -> int:
        return self.node.start_mark.line + 1

    def error(self, message: str) -> ConfigError:
        return ConfigError(self.file, self.path or "(top level)", message, self.line)

    def child(self, node: yaml.Node, key: str | int) -> Node:
        if isinstance(key, str) and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", key):
            key = repr(key)   # a hostile key is shown quoted, never as raw text in the path
        sub = f"{self.path}[{key}]" if isinstance(key, int) else (f"{self.path}.{key}" if self.path else key)
        return Node(self.file, node, sub)

    def _tag(self, want: str) -> None:
        if self.node.tag != want:
            raise self.error(f"tag {self.node.tag!r} is not allowed (plain YAML only)")

    def mapping(self, allowed: Iterable[str], required: Iterable[str] = ()) -> dict[str, Node]:
        if not isinstance(self.node, yaml.MappingNode):
            raise self.error(f"expected a mapping, got {self._kind()}")
        self._tag(MAP_TAG)
        out: dict[str, Node] = {}
        allowed = set(allowed)
        for k, v in self.node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) and k.tag == "tag:yaml.org,2002:str" else None
            if key not in allowed:
                bad = self.child(k, key) if isinstance(key, str) else Node(self.file, k, self.path)
                what = "unknown key" if isinstance(key, str) else f"keys must be plain text, got {_describe(k)}"
                raise bad.error(f"{what} (allowed: {', '.join(sorted(allowed))})")
            if key in out:
                raise self.child(k, key).error("duplicate key")
            out[key] = self.child(v, key)
        for r in required:
            if r not in out:
                raise self.error(f"missing required key {r!r}")
        return out

    def seq(self, min_len: int = 0) -> list[Node]:
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.error(f"expected a list, got {self._kind()}")
        self._tag(SEQ_TAG)
        if len(self.node.value) > MAX_LIST:
            # aliases make long lists cheap to write; no list in a topology is near this
            raise self.error(f"{len(self.node.value)} items; a list has at most {MAX_LIST}")
        items = [self.child(n, i) for i, n in enumerate(self.node.value)]
        if len(items) < min_len:
            raise self.error(f"needs at least {min_len} item(s)")
        return items

    def scalar(self) -> Any:
        if not isinstance(self.node, yaml.ScalarNode):
            raise self.error(f"expected a single value, got {self._kind()}")
        if self.node.tag not in PLAIN_TAGS:
            raise self.error(f"tag {self.node.tag!r} is not allowed (plain YAML only)")
        try:
            # Built from the node itself: no re-serialising, no constructor beyond the safe one.
            return yaml.constructor.SafeConstructor().construct_object(self.node, deep=True)
        except Exception as e:  # noqa: BLE001 - the constructors raise anything on odd input
            # e.g. an integer of more than 4300 digits (Python's int-from-text limit),
            # `!!bool maybe` (KeyError), `!!timestamp zz` (AttributeError)
            raise self.error(f"unreadable value {show(self.node.value)}: {e.__class__.__name__}") from None

    def str(self, pattern: re.Pattern | None = None, what: str = "") -> str:
        v = self.scalar()
        if not isinstance(v, str):
            raise self.error(f"expected text, got {show(v)}")
        if pattern and not pattern.fullmatch(v):
            raise self.error(f"invalid {what or 'value'} {show(v)}")
        return v

    def int(self, lo: int, hi: int, what: str = "value") -> int:
        v = self.scalar()
        # bool is an int in Python: `true` must not pass as 1
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(f"{what} must be an integer, got {show(v)}")
        if not lo <= v <= hi:
            raise self.error(f"{what} {show(v)} out of range {lo}..{hi}")
        return v

    def float(self, lo: float, hi: float) -> float:
        v = self.scalar()
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.error(f"expected a number, got {show(v)}")
        # NaN compares false both ways; an integer too large for a float compares exactly
        # (math.isfinite on it would raise OverflowError)
        if not lo <= v <= hi or (isinstance(v, float) and not math.isfinite(v)):
            raise self.error(f"{show(v)} out of range {lo}..{hi}")
        return float(v)

    def bool(self) -> bool:
        v = self.scalar()
        if not isinstance(v, bool):
            raise self.error(f"expected true or false, got {show(v)}")
        return v

    def enum(self, cls: type) -> Any:
        v = self.scalar()
        try:
            return cls(v)
        except ValueError:
            raise self.error(f"unknown value {show(v)} (one of: {', '.join(m.value for m in cls)})") from None

    def _kind(self) -> str:
        return _describe(self.node)


def show(v: Any) -> str:
    """A value quoted for a one-line message (repr: newlines and quotes escaped), capped."""
    try:
        text = repr(v)
    except ValueError:          # an int too long to print (over 4300 digits)
        text = f"<a {v.bit_length()}-bit number>"
    return one_line(text, 80)


def _describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if node.tag == "tag:yaml.org,2002:null":
        return "nothing (an empty value)"
    return show(node.value)


def oserror(e: BaseException) -> str:
    return getattr(e, "strerror", None) or e.__class__.__name__


def compose(text: str, file: str, what: str = "topology") -> yaml.Node:
    """One YAML document composed into nodes (never constructed into objects), bounded in depth;
    anything malformed is one ConfigError naming the file and line. Shared by every YAML file a
    user gives (topologies, image recipes)."""
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or (str(e).splitlines() or [e.__class__.__name__])[0]
        if "another document" in problem:
            problem = f"more than one YAML document (a {what} is one)"
        raise ConfigError(file, "(yaml)", f"malformed YAML: {problem}",
                          mark.line + 1 if mark else None) from None
    except RecursionError:
        raise ConfigError(file, "(yaml)", "nested too deeply") from None
    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == "tag:yaml.org,2002:null"):
        # no document, only comments, or only document markers
        raise ConfigError(file, "(top level)", f"empty file (no {what} in it)")
    return root


def read_text(path: str | os.PathLike, limit: int = 0, what: str = "") -> str:
    """A user's text file: regular, at most ``limit`` bytes (default: a topology's cap), UTF-8.
    Anything the file system says is one ConfigError naming the file; ``what`` names the kind
    of file in the size message ("a topology is at most ...")."""
    limit = limit or MAX_FILE_BYTES
    p = Path(path)
    file = str(p)
    try:
        st = p.stat()
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError(file, "(file)", "cannot read: is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(file, "(file)", "cannot read: not a regular file")
        if st.st_size > limit:
            cap = f"a {what} is at most {limit} bytes" if what else f"at most {limit}"
            raise ConfigError(file, "(file)", f"too large ({st.st_size} bytes; {cap})")
        with p.open("rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise ConfigError(file, "(file)", f"too large (over {limit} bytes)")
        return data.decode("utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(file, "(file)", "no such file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(file, "(file)", f"cannot read: not UTF-8 text (byte {e.start})") from None
    except (OSError, RuntimeError, ValueError) as e:
        raise ConfigError(file, "(file)", f"cannot read: {oserror(e) if isinstance(e, OSError) else e}") from None


#: an interface name the kernel accepts (dev_valid_name: at most 15 bytes) and no tool takes for an option
IFNAME_RE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,14}")


def ifname(n: Node) -> str:
    """An interface name the kernel accepts (dev_valid_name) and no tool mistakes for an option."""
    v = n.str()
    if v in (".", "..") or not IFNAME_RE.fullmatch(v):
        raise n.error(f"invalid interface name {show(v)} (1 to 15 of letters, digits, '_', '.', '-'; "
                      "not '.' or '..', not starting with '-')")
    return v
