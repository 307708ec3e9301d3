"""Read a config file into a mapping, with the line of each key.

The YAML is composed into nodes first, which keep their line, so every
problem found later can name the line to edit; a key written twice is
refused here (yaml.safe_load would keep the last value without a word).
Whatever stops the file being read at all raises ConfigError; a file that
is empty and one that is not valid YAML say so differently.
"""

import os
from typing import Any

import yaml

from .schema import ConfigError, Problem

_MERGE_TAG = "tag:yaml.org,2002:merge"
FIRST_KEY_FIX = "write at least `remote_url: eic://HOST:PORT`, or `remote_url: local://` for the embedded engine"


class ConfigFile:
    """The keys of one YAML file: values, lines, and the duplicates found."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.values: dict[str, Any] = {}
        self.lines: dict[str, int] = {}
        self.problems: list[Problem] = []
        self._read(_text_of(path))

    def _read(self, text: str) -> None:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                raise ConfigError(self.path, None, "is empty: it holds no keys", FIRST_KEY_FIX)
            if not isinstance(node, yaml.MappingNode):
                kind = "sequence" if isinstance(node, yaml.SequenceNode) else "single value"
                raise ConfigError(
                    self.path, None, f"expected a mapping of keys to values, got a YAML {kind}", FIRST_KEY_FIX
                )
            self._read_mapping(loader, node)
        except ConfigError:
            raise
        except yaml.MarkedYAMLError as e:
            raise ConfigError(self.path, None, *_syntax_error(e)) from None
        except (yaml.YAMLError, ValueError, RecursionError) as e:  # whatever a hostile file makes the parser raise
            raise ConfigError(self.path, None, f"could not be parsed: {e!r}", "correct the YAML syntax") from None
        finally:
            loader.dispose()

    def _read_mapping(self, loader: yaml.SafeLoader, node: yaml.MappingNode) -> None:
        # Keys written in this mapping, before `<<: *anchor` merges add others
        # (which the keys written here may override, as YAML intends).
        written = {id(key_node) for key_node, _ in node.value if key_node.tag != _MERGE_TAG}
        if len(written) != len(node.value):
            loader.flatten_mapping(node)
        written_at: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            key = loader.construct_object(key_node, deep=True) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str):
                shown = repr(key) if isinstance(key_node, yaml.ScalarNode) else "a YAML collection"
                fix = "write the key as a name, such as eic_kv_ns"
                self.problems.append(Problem(shown, "keys must be names", fix, line))
                continue
            if id(key_node) in written:
                if key in written_at:
                    twice = f"is set twice, on lines {written_at[key]} and {line}"
                    self.problems.append(Problem(key, twice, "keep one of the two", line))
                    continue
                written_at[key] = line
            self.values[key] = loader.construct_object(value_node, deep=True)
            self.lines[key] = line


def _syntax_error(e: yaml.MarkedYAMLError) -> tuple[str, str]:
    """(problem, fix) of a YAML syntax error, with its line and column, and
    where the construct it broke began (an unclosed [ fails at the end)."""
    mark, began = e.problem_mark or e.context_mark, e.context_mark
    problem = "is not valid YAML"
    if mark is not None:
        problem += f" at line {mark.line + 1}, column {mark.column + 1}"
    problem += f": {e.problem or e.context or 'syntax error'}"
    if began is not None and mark is not None and e.context and began.line != mark.line:
        problem += f" ({e.context} that began at line {began.line + 1}, column {began.column + 1})"
    fix_at = began if began is not None and e.context else mark
    return problem, "correct the YAML syntax" + (f" at line {fix_at.line + 1}" if fix_at is not None else "")


def _text_of(path: str) -> str:
    if not os.path.exists(path):
        raise ConfigError(
            path, None, "file does not exist", "pass the path of the config file (--config, or the env var)"
        )
    if os.path.isdir(path):
        raise ConfigError(path, None, "is a directory, expected a YAML file", "pass the path of the file inside it")
    try:
        with open(path, encoding="utf-8") as fin:
            return fin.read()
    except UnicodeDecodeError as e:
        raise ConfigError(
            path,
            None,
            f"is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})",
            "save it as UTF-8",
        ) from None
    except OSError as e:
        raise ConfigError(path, None, f"cannot be read: {e.strerror}", "make it readable by this user") from None
