"""The Lua library's shape (issue 52): each store script is its own file, the libraries it names on its
``-- requires:`` line, and a header written from ``store/layout.py``. A script names exactly the libraries it
uses, every file stays readable, and a key of the wrong type is refused before any write, whether the key
is one a store usually has or one that is mostly missing (checked after one EXISTS)."""

from __future__ import annotations

import re
from importlib.resources import files

import pytest
import redis

from celery_redisdelay import RedisDelay, StoreUnavailableError
from celery_redisdelay.store import scripts
from celery_redisdelay.store.layout import STORE_KEYS

LUA = files("celery_redisdelay.store").joinpath("lua")
LIBRARIES = sorted(path.name[: -len(".lua")] for path in LUA.joinpath("lib").iterdir() if path.name.endswith(".lua"))
SCRIPTS = sorted(
    path.name[: -len(".lua")] for path in LUA.iterdir() if path.name.endswith(".lua")
)  # the store's and the standalone ones, pause.lua besides
MOST_LINES = 400


def text_of(name: str) -> str:
    return LUA.joinpath(f"lib/{name}.lua" if name in LIBRARIES else f"{name}.lua").read_text(encoding="utf-8")


def defined_by() -> dict[str, str]:
    """Each name a library defines at its top level -> the library."""
    names: dict[str, str] = {}
    for library in LIBRARIES:
        for found in re.finditer(r"^local (?:function )?([A-Za-z_][A-Za-z_0-9, ]*)", text_of(library), re.M):
            for name in found.group(1).split(","):
                names[name.strip()] = library
    return names


@pytest.mark.parametrize("name", LIBRARIES + SCRIPTS)
def test_each_file_requires_exactly_the_libraries_it_uses(name: str) -> None:
    text = text_of(name)
    own = name if name in LIBRARIES else None
    # A name the file declares itself, at any depth, is its own (a local that shadows a library's).
    declared = {
        word.strip()
        for found in re.findall(r"\blocal (?:function )?([A-Za-z_][A-Za-z_0-9, ]*)", text)
        for word in found.split(",")
    }
    names = scripts.used_names(text) - declared
    used = {library for word, library in defined_by().items() if library != own and word in names}
    assert sorted(scripts.requires(text)) == sorted(used)


@pytest.mark.parametrize("name", ["track", "start", "ack", "send", "release"])
def test_a_script_defines_only_what_it_uses(name: str) -> None:
    """A worker's start of a call pays for no pause or release helper, and no check of keys it never touches."""
    source = scripts.source(name)
    used = scripts.used_names(scripts.body(text_of(name)))
    for key in STORE_KEYS:
        assert (f"local {key.lua} = KEYS[" in source) == (key.lua in used)
    if name in ("track", "start", "ack"):
        assert "local function load_pauses" not in source
        assert "local function count_releases" not in source
        assert "PAUSES" not in used


def test_no_lua_file_is_over_400_lines() -> None:
    lengths = {name: len(text_of(name).splitlines()) for name in LIBRARIES + SCRIPTS}
    assert {name: n for name, n in lengths.items() if n > MOST_LINES} == {}


def test_every_script_loads(client: redis.Redis) -> None:
    """Redis compiles each assembled script (Lua 5.1 allows 200 locals in a chunk)."""
    for name in (*scripts.STORE_SCRIPTS, *scripts.STANDALONE_SCRIPTS):
        client.script_load(scripts.source(name))


def test_keys_are_in_the_order_of_the_layout(rd: RedisDelay) -> None:
    assert rd.keys.store_keys == [getattr(rd.keys, key.name) for key in STORE_KEYS]
    header = scripts.source("release")
    for position, key in enumerate(STORE_KEYS, start=1):
        assert f"local {key.lua} = KEYS[{position}]  -- {key.type}" in header


@pytest.mark.parametrize("key_name", ["meta", "holders", "index"])
def test_a_key_of_the_wrong_type_stops_an_ack_before_it_writes(
    rd: RedisDelay, client: redis.Redis, key_name: str
) -> None:
    """``meta`` is checked by type, ``holders`` and ``index`` after the EXISTS that finds one of the mostly missing
    keys there: either way the call stays tracked, unacknowledged."""
    rd.store.park("call", b"{}", {"m": 1}, countdown_ms=0)
    assert [claimed.id for claimed in rd.store.claim(10, 60_000)] == ["call"]
    rd.store.confirm(["call"], 60_000)
    client.set(getattr(rd.keys, key_name), "someone else's string")
    before = {key: client.dump(key) for key in rd.keys.store_keys}
    with pytest.raises(StoreUnavailableError, match=rf"WRONGTYPE redisdelay key .*{key_name} holds a string"):
        rd.store.track([("acked", "call")], 60_000)
    assert {key: client.dump(key) for key in rd.keys.store_keys} == before


def test_used_names_are_the_code_s_names_not_fields_strings_or_comments() -> None:
    text = "local x = 'DEAD' .. DELAYED .. meta.s -- INFLIGHT\nlocal t = {META = 1, s = PAYLOADS, ...}\nt:send()"
    assert scripts.used_names(text) == {"local", "x", "DELAYED", "meta", "t", "PAYLOADS"}
