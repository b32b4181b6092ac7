"""Reading the config file: its text read once, YAML whose keys are unique, and the folder that its
relative paths resolve against.

A config may come from a pipe (``-c /dev/stdin``, ``-c <(...)``, a FIFO): such a stream can be read
only once, and it has no folder of its own.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from senddock.errors import ConfigError

# libyaml's parser when PyYAML was built with it (several times faster); the constructor, where
# keys become a dict, is the same Python SafeConstructor either way.
_SafeLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE = "tag:yaml.org,2002:merge"
# Paths that name a stream or a descriptor, whatever it is connected to: /dev/stdin redirected from
# a file is a regular file through /proc/self/fd/0, but /dev is no folder of the user's.
_STREAM_FOLDERS = ("dev", "proc")


class DuplicateKeys(yaml.YAMLError):
    """Keys written twice in one mapping: ``(line, path, key, first_line)`` each, lines from 1."""

    def __init__(self, found: list[tuple[int, tuple, Any, int]]) -> None:
        super().__init__(f"{len(found)} duplicate keys")
        self.found = found


class UniqueKeyLoader(_SafeLoader):  # type: ignore[misc, valid-type]
    """A SafeLoader that refuses a key written twice in one mapping.

    YAML requires keys to be unique, yet PyYAML keeps the last one silently: a second ``smtp:``
    written further down would replace the first without a word. The check runs on the composed
    node tree, once, before anything is constructed.
    """

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            found = sorted(self._duplicates(node), key=lambda f: f[0])
            if found:
                raise DuplicateKeys(found)
        return node

    def _duplicates(self, root: yaml.Node) -> Iterator[tuple[int, tuple, Any, int]]:
        stack: list[tuple[yaml.Node, tuple]] = [(root, ())]
        visited: set[int] = set()  # an alias is the same node again, and may even contain itself
        while stack:
            node, path = stack.pop()
            if id(node) in visited:
                continue
            visited.add(id(node))
            if isinstance(node, yaml.SequenceNode):
                stack.extend((item, path + (i,)) for i, item in enumerate(node.value))
            elif isinstance(node, yaml.MappingNode):
                first: dict[Any, int] = {}
                for key_node, value_node in node.value:
                    if key_node.tag == _MERGE:  # keys written beside `<<` override the merged ones
                        stack.append((value_node, path))
                        continue
                    key = self._key(key_node)
                    line = key_node.start_mark.line + 1
                    if key in first:
                        yield line, path, key, first[key]
                    elif key is not None:
                        first[key] = line
                    stack.append((value_node, path + (key,)))

    def _key(self, node: yaml.Node) -> Any:
        """The key as constructed ('x' and "x" are one key, so are 1 and 0x1); None if unhashable."""
        if not isinstance(node, yaml.ScalarNode):
            return None
        key = self.construct_object(node)
        try:
            hash(key)
        except TypeError:
            return None
        return key


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells a file changed without reading it: modification time, size and inode (an editor
    that saves by renaming makes a new one); None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def read_config(path: Path) -> Any:
    """The YAML document of ``path`` (``{}`` when empty), read once; ConfigError naming the file
    and line for anything wrong."""
    try:
        with open(path, "rb") as stream:
            data = stream.read()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the config file: {exc.strerror or exc}"]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError([f"{path}:{line}: not UTF-8 text ({exc.reason})"]) from None
    loader = UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        return (loader.construct_document(node) if node is not None else None) or {}
    except DuplicateKeys as exc:
        raise ConfigError([
            f"{path}:{line}: duplicate key {key!r}" + (f" in {_json_path(where)}" if where else "")
            + f" (first at line {first})"
            for line, where, key, first in exc.found
        ]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{path}{where}: not valid YAML: {problem}"]) from None
    finally:
        loader.dispose()


def config_folder(path: Path | None) -> Path:
    """The folder that the config's relative paths resolve against, absolute.

    The config file's own folder; the current directory for the defaults and for a config that has
    no folder of its own: a pipe, a FIFO, a process substitution, /dev/stdin.
    """
    if path is None or not rereadable(path):
        return Path.cwd()
    return Path(os.path.abspath(path)).parent


def rereadable(path: Path) -> bool:
    """Whether ``path`` is a regular file that may be read again (a running node watches it), not
    a stream whatever it is connected to (see _STREAM_FOLDERS)."""
    absolute = Path(os.path.abspath(path))
    try:
        regular = stat.S_ISREG(absolute.stat().st_mode)
    except OSError:
        regular = False
    return regular and absolute.parts[1:2] not in [(folder,) for folder in _STREAM_FOLDERS]


def _json_path(parts: tuple) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)
