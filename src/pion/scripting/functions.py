"""Redis functions: the libraries FUNCTION LOAD keeps, as redis-server 7.0 keeps them.

A library is Lua code whose first line names it (``#!lua name=<lib>``); loading runs
the code once in a sandbox that offers only ``redis.register_function``, ``redis.log``
and the version constants (``pion.scripting.sandbox``), and keeps the callbacks it
registered. Function names are one namespace across libraries. Unlike the script
cache, the libraries are part of the dataset: every change goes to the log first, as
the whole set of library codes (``pion.persistence.functions_format``), then applies.
A change is checked completely (compiled, registered, no collision) before the log
sees it, so a refused change logs nothing.

``FUNCTION DUMP``'s payload is Redis's: per library the RDB opcode FUNCTION2 (245) and
its code as an RDB string, then the RDB version and Redis's CRC-64
(``pion.keyspace.rdb``), so a dump moves between redis-server and pion-server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pion.errors import PionError
from pion.keyspace.rdb import RDB_VERSION, BadFormat, crc64, payload_ok, put_length
from pion.keyspace.rdb import Reader as RdbReader

__all__ = [
    "FLAG_ORDER",
    "Function",
    "Libraries",
    "Library",
    "Loader",
    "dump_libraries",
    "parse_dump",
]

# The flags a function may carry, in the order FUNCTION LIST names them (Redis's table).
FLAG_ORDER = ("no-writes", "allow-oom", "allow-stale", "no-cluster", "allow-cross-slot-keys")
_FUNCTION2 = 245  # RDB_OPCODE_FUNCTION2
_NAME_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_BAD_NAME = (
    "Library names can only contain letters, numbers, or underscores(_) and must be at "
    "least one character long"
)


class Loader(Protocol):
    """What runs a library's code (``pion.scripting.runtime.Scripts``)."""

    def load_library(self, code: bytes) -> list[tuple[str, Any, list[str], bytes | None]]: ...


@dataclass(frozen=True)
class Function:
    name: str
    library: str
    callback: Any  # the Lua function
    flags: tuple[str, ...]
    description: bytes | None


@dataclass
class Library:
    name: str
    code: bytes
    functions: dict[str, Function] = field(default_factory=dict)


def parse_metadata(code: bytes) -> str:
    """The library's name from its first line (``functionExtractLibMetaData``), with
    redis-server's errors."""
    if not code.startswith(b"#!"):
        raise PionError("Missing library metadata")
    end = code.find(b"\n")
    if end < 0:
        raise PionError("Invalid library metadata")
    parts = code[2:end].split()
    engine = parts[0] if parts else b""
    name: bytes | None = None
    for part in parts[1:]:
        if part[:5].lower() == b"name=":
            if name is not None:
                raise PionError("Invalid metadata value, name argument was given multiple times")
            name = part[5:]
            continue
        raise PionError(f"Invalid metadata value given: {part.decode('utf-8', 'replace')}")
    if name is None:
        raise PionError("Library name was not given")
    if engine.upper() != b"LUA":
        raise PionError(f"Engine '{engine.decode('utf-8', 'replace')}' not found")
    if not name or not set(name) <= _NAME_CHARS:
        raise PionError(_BAD_NAME)
    return name.decode()


class Libraries:
    """One worker's libraries and the function namespace they share."""

    def __init__(self, scripts: Loader) -> None:
        self._scripts = scripts
        self.libraries: dict[str, Library] = {}
        self.functions: dict[str, Function] = {}
        # Where each change's record goes before it applies (the log), if anywhere:
        # called with every library's code as the set will be.
        self.journal: Callable[[list[bytes]], None] | None = None

    def _build(self, code: bytes) -> Library:
        """Compile and register ``code`` into a library not yet linked anywhere."""
        name = parse_metadata(code)
        lib = Library(name, code)
        # The code runs without its first line, but from its newline, so that line
        # numbers in errors count the first line (as Redis's md.code does).
        registered = self._scripts.load_library(code[code.find(b"\n") :])
        if not registered:
            raise PionError("No functions registered")
        for fname, callback, flags, desc in registered:
            ordered = tuple(f for f in FLAG_ORDER if f in flags)
            lib.functions[fname] = Function(fname, name, callback, ordered, desc)
        return lib

    def _commit(self, libraries: dict[str, Library], *, journal: bool = True) -> None:
        """Make ``libraries`` the set, its record logged first; PionError (nothing
        changes) when two of them register the same function."""
        functions: dict[str, Function] = {}
        for lib in libraries.values():
            for fname, fn in lib.functions.items():
                if fname in functions:
                    raise PionError(f"Function {fname} already exists")
                functions[fname] = fn
        if journal and self.journal is not None:
            self.journal([lib.code for lib in libraries.values()])
        self.libraries, self.functions = libraries, functions

    def load(self, code: bytes, replace: bool) -> str:
        """FUNCTION LOAD: the library's name."""
        name = parse_metadata(code)
        if name in self.libraries and not replace:
            raise PionError(f"Library '{name}' already exists")
        lib = self._build(code)
        libraries = dict(self.libraries)
        libraries.pop(name, None)
        self._commit({**libraries, name: lib})
        return name

    def delete(self, name: str) -> None:
        if name not in self.libraries:
            raise PionError("Library not found")
        self._commit({k: v for k, v in self.libraries.items() if k != name})

    def flush(self) -> None:
        self._commit({})

    def restore(self, payload: bytes, policy: str) -> None:
        """FUNCTION RESTORE with policy FLUSH, APPEND or REPLACE (``libraryJoin``)."""
        incoming: dict[str, Library] = {}
        for code in parse_dump(payload):
            lib = self._build(code)
            if lib.name in incoming:
                raise PionError(f"Library '{lib.name}' already exists")
            incoming[lib.name] = lib
        if policy == "FLUSH":
            self._commit(incoming)
            return
        libraries = dict(self.libraries)
        for name in incoming:
            if name in libraries and policy != "REPLACE":
                raise PionError(f"Library {name} already exists")
            libraries.pop(name, None)
        self._commit({**libraries, **incoming})

    def codes(self) -> list[bytes]:
        return [lib.code for lib in self.libraries.values()]

    def apply(self, codes: Iterable[bytes]) -> None:
        """Replay a logged set of libraries (recovery): not logged again."""
        libraries: dict[str, Library] = {}
        for code in codes:
            lib = self._build(code)
            libraries[lib.name] = lib
        self._commit(libraries, journal=False)


def dump_libraries(codes: Iterable[bytes]) -> bytes:
    """FUNCTION DUMP's payload (module docstring); strings are written uncompressed,
    which every redis-server reads."""
    out = bytearray()
    for code in codes:
        out.append(_FUNCTION2)
        put_length(out, len(code))
        out += code
    out += RDB_VERSION.to_bytes(2, "little")
    out += crc64(bytes(out)).to_bytes(8, "little")
    return bytes(out)


def parse_dump(payload: bytes) -> list[bytes]:
    """The library codes a FUNCTION DUMP payload holds; PionError with Redis's text."""
    if not payload_ok(payload):
        raise PionError("DUMP payload version or checksum are wrong")
    r = RdbReader(payload[:-10])
    codes = []
    try:
        while r.at < len(r.body):
            if r.byte() != _FUNCTION2:
                raise PionError("given type is not a function")
            codes.append(r.string())
    except BadFormat:
        raise PionError("failed loading the given functions payload") from None
    return codes
