"""Parse trees cached on disk come back exactly as the parser made them, a run that parses
nothing new never loads the parser, and a cache file or directory that cannot be trusted
only costs time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import lark
import pytest

from gpudra.scheduling.cel import tree_cache
from gpudra.scheduling.cel.grammar import _parse
from gpudra.scheduling.cel.tree_cache import TreeCache, decode, encode

A = "device.attributes['gpu.nvidia.com']"
EXPRESSIONS = [
    f"{A}.productName.startsWith('NVIDIA H100')",
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
    f"{A}.?numaNode.orValue(-1) >= 0 && device.capacity['gpu.nvidia.com'].memory"
    ".compareTo(quantity('40Gi')) >= 0",
    f"{A}.driverVersion.isGreaterThan(semver('550.0.0')) ||\n  {A}['index'] in [0u, 1u]",
    "[1, 2, 3].all(x, x > 0) && {'a': b'\\x00', 'b': null}[?'a'].hasValue() && true != false",
    "cel.bind(p, device.attributes['gpu.nvidia.com'].profile, p.matches('^[0-9]g') "
    "? 1.5e3 : -2.0) > 0.0",
]


def positions(node: Any) -> Any:
    """Everything about a tree, positions included (Lark's ``==`` ignores them)."""
    if isinstance(node, lark.Token):
        return ("token", node.type, str(node), node.start_pos, node.line, node.column,
                node.end_line, node.end_column, node.end_pos)
    meta = sorted(vars(node._meta).items()) if node._meta is not None else None
    return (str(node.data), meta, [positions(c) for c in node.children])


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_a_decoded_tree_is_the_parsed_one(text):
    tree = _parse(text)
    again = decode(json.loads(json.dumps(encode(tree))))
    assert again == tree
    assert positions(again) == positions(tree)


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_get_returns_what_put_stored(tmp_path, text):
    cache = TreeCache(tmp_path)
    assert cache.get(text) is None
    cache.put(text, _parse(text))
    assert positions(cache.get(text)) == positions(_parse(text))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


@pytest.mark.parametrize("damage", [
    b"", b"{not json", b"[]", b'{"expression": "other", "tree": ["expr", null, []]}',
    b'{"expression": "1 + 2", "tree": ["expr", {"__class__": 1}, []]}',
    b'{"expression": "1 + 2", "tree": ["expr", null, [["INT", 1, 2]]]}',
    b'{"expression": "1 + 2", "tree": ["IDENT", "x", 0, 1, 1, 1, 2, "1"]}',
    b'{"expression": "1 + 2"}',
])
def test_a_damaged_or_foreign_file_is_a_miss(tmp_path, damage):
    cache = TreeCache(tmp_path)
    cache.put("1 + 2", _parse("1 + 2"))
    [stored] = tmp_path.iterdir()
    stored.write_bytes(damage)
    assert cache.get("1 + 2") is None
    cache.put("1 + 2", _parse("1 + 2"))  # and the next parse rewrites it
    assert cache.get("1 + 2") == _parse("1 + 2")


def test_past_the_limit_the_older_half_goes(tmp_path, monkeypatch):
    monkeypatch.setattr(tree_cache, "LIMIT", 4)
    cache = TreeCache(tmp_path)
    texts = [f"{i} + 1" for i in range(5)]
    for age, text in enumerate(texts[:4]):
        cache.put(text, _parse(text))
        os.utime(cache._path(text), (1_000_000 + age, 1_000_000 + age))
    cache.put(texts[4], _parse(texts[4]))
    assert [cache.get(t) is not None for t in texts] == [False, False, True, True, True]


def test_only_a_private_directory_is_used(tmp_path):
    private = tmp_path / "mine"
    assert tree_cache.private_directory(private)
    assert private.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert not tree_cache.private_directory(shared)
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert not tree_cache.private_directory(a_file)


def test_a_symlink_or_an_open_parent_is_not_private(tmp_path):
    """Someone else could swap what the path names and have Lark load their pickle."""
    target = tmp_path / "target"
    assert tree_cache.private_directory(target)
    link = tmp_path / "link"
    link.symlink_to(target)
    assert not tree_cache.private_directory(link)
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    open_parent.chmod(0o777)  # anyone may rename entries here
    assert not tree_cache.private_directory(open_parent / "gpudra")
    open_parent.chmod(0o1777)  # sticky, as /tmp: only the owner may
    assert tree_cache.private_directory(open_parent / "gpudra")


PROBE = textwrap.dedent("""
    import sys
    from gpudra.scheduling.cel import CelCompileError, compile_selector, grammar
    for text in sys.argv[1:]:
        try:
            selector = compile_selector(text)
            print(selector.ast.pretty(), selector.footprint)
        except CelCompileError as exc:
            print("error:", exc)
    print("parser loaded:", grammar._parser.cache_info().currsize)
""")


def run(cache_home: Path, *texts: str) -> str:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    return subprocess.run([sys.executable, "-c", PROBE, *texts], env=env, check=True,
                          capture_output=True, text=True).stdout


def test_the_second_run_never_loads_the_parser(tmp_path):
    first = run(tmp_path, *EXPRESSIONS)
    assert first.endswith("parser loaded: 1\n")
    [trees] = (tmp_path / "gpudra").glob("cel-trees-*")
    assert len(list(trees.iterdir())) == len(EXPRESSIONS)
    second = run(tmp_path, *EXPRESSIONS)
    assert second == first.replace("parser loaded: 1", "parser loaded: 0")


def test_syntax_errors_are_not_cached(tmp_path):
    first = run(tmp_path, "device.driver ==", "1 + 1")
    assert first.startswith("error: Syntax error: unexpected end of input")
    assert run(tmp_path, "device.driver ==", "1 + 1") == first
    [trees] = (tmp_path / "gpudra").glob("cel-trees-*")
    assert len(list(trees.iterdir())) == 1


def test_a_shared_cache_directory_is_not_used(tmp_path):
    (tmp_path / "gpudra").mkdir(mode=0o777)
    (tmp_path / "gpudra").chmod(0o777)
    reference = run(tmp_path.parent / f"{tmp_path.name}-private", *EXPRESSIONS)
    assert run(tmp_path, *EXPRESSIONS) == reference
    assert list((tmp_path / "gpudra").iterdir()) == []
