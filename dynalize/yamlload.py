"""YAML read with a bound on what its aliases expand to.

PyYAML builds an alias as a second reference to its anchor's value, so a 1 KB file of nested
aliases (`b: [*a, *a, ...]`, `c: [*b, *b, ...]`, ...) loads instantly as a small graph, but
everything that walks it as a tree (validation, copies, dumps) visits each value once per path:
such a file was seen to grow to 34 MB in 54 s. `safe_load` counts the values of the document as
a tree, each alias expanded, before building anything, and refuses more than `MAX_VALUES` with
one line (and a value that holds itself through an alias). A key given twice in one mapping is
refused too, naming both lines, and so is nesting past `MAX_DEPTH` levels.
"""

from __future__ import annotations

from typing import Any

import yaml

from .errors import ConfigError

MAX_VALUES = 100_000
"""The most values (mappings, lists, scalars; keys included) a config may expand to. A full run
config holds a few hundred; a task's data lives in its own files, not in the config."""
MAX_DEPTH = 100
"""The deepest nesting a config may have (a run config is under ten levels deep): PyYAML, pydantic
and every walk of the settings recurse, and thousands of levels exhaust Python's stack."""


def safe_load(text: str, where: str) -> Any:
    """`yaml.safe_load(text)`, or ConfigError naming `where` when its aliases expand past `MAX_VALUES`
    values or a value holds itself; yaml.YAMLError for text that is not YAML."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:  # the composer recurses once per level
            raise _too_deep(where) from None
        if node is None:
            return None
        if expanded_size(node, {}, set(), where=where) > MAX_VALUES:
            raise ConfigError(f"config error: {where}: its aliases expand to more than {MAX_VALUES:,} values "
                              f"(a config holds settings, not data: write them out, or put data in a file)")
        try:
            return loader.construct_document(node)
        except ValueError as e:  # an integer of more than 4,300 digits (Python's int-from-text limit)
            raise ConfigError(f"config error: {where}: a value cannot be read: {str(e).split(';')[0]}") from None
    finally:
        loader.dispose()


def _too_deep(where: str) -> ConfigError:
    return ConfigError(f"config error: {where}: nested more than {MAX_DEPTH} levels deep (a config is a few levels "
                       f"deep: write the settings out, or put data in a file)")


def expanded_size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int], depth: int = 0,
                  where: str = "the config") -> int:
    """How many values `node` holds as a tree, each alias expanded (each distinct node counted
    once: linear in the file, however large the expansion); ConfigError past `MAX_DEPTH` levels."""
    if depth > MAX_DEPTH:
        raise _too_deep(where)
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        raise ConfigError("config error: a YAML alias refers to a value that holds it (an endless config)")
    open_nodes.add(key)
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
        _no_duplicate_keys(node, where)
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    else:
        children = []
    total = 1
    for child in children:
        total += expanded_size(child, sizes, open_nodes, depth + 1, where)
        if total > MAX_VALUES:  # stop counting: the answer is already "too large"
            break
    open_nodes.discard(key)
    sizes[key] = total
    return total


def _no_duplicate_keys(node: yaml.MappingNode, where: str) -> None:
    """ConfigError naming a key a mapping gives twice and both its lines (YAML would keep the last
    value without a word: a setting edited in one place and overridden further down)."""
    first: dict[str, int] = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        line = key.start_mark.line + 1
        if key.value in first:
            raise ConfigError(f"config error: {where}: key {key.value!r} is given twice (lines {first[key.value]} and "
                              f"{line}): YAML would keep the last one without a word; keep one")
        first[key.value] = line
