"""Reading the JSON that benchmark harnesses write, safely.

Every harness source reads its bytes through here, so each hazard is handled once:
- a gzip file is unpacked, within a bound (a gzip bomb is refused, not expanded);
- a UTF-8 byte-order mark is dropped; other bytes that are not UTF-8 are refused;
- a whole document is bounded in size and nesting depth before a parser pays for it;
- JSON Lines are read one line at a time (a 100 MB trace file never becomes one tree), each
  line bounded on its own, and a bad line is that line's problem alone;
- NaN, Infinity and duplicate keys are accepted by the parser but marked, so the one record
  that holds them is quarantined and its neighbours land.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from json.decoder import JSONObject  # type: ignore[attr-defined]
from json.scanner import py_make_scanner  # type: ignore[attr-defined]
from typing import Any

from pipelines.records.rules import Reason

GZIP_MAGIC = b"\x1f\x8b"
MAX_UNPACKED_BYTES = 512 * 1024 * 1024
MAX_DOCUMENT_BYTES = 256 * 1024 * 1024  # a document is parsed whole; JSON Lines stream
MAX_LINE_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 64
RAW_LIMIT = 4096  # characters of a record's text kept with a quarantine row

# Reasons a quarantine row gives for JSON that cannot be read.
TOO_LARGE = Reason.TOO_LARGE
TOO_DEEP = Reason.TOO_DEEP
NOT_UTF8 = Reason.ENCODING
JSON_SYNTAX = Reason.JSON_SYNTAX
NON_FINITE = Reason.NON_FINITE_NUMBER
DUPLICATE_KEY = Reason.DUPLICATE_KEY


class JsonInputError(ValueError):
    """The bytes cannot be read as JSON at all (size, depth, encoding, syntax)."""

    def __init__(self, reason: str, detail: str, line: int = 1) -> None:
        super().__init__(f"{reason}: {detail} (line {line})")
        self.reason = reason
        self.detail = detail
        self.line = line


class KeyedObject(dict[str, Any]):
    """A JSON object that remembers the keys it held twice (the first value wins) and, in a
    document small enough to track them, the line it starts on."""

    __slots__ = ("duplicates", "line")

    def __init__(self) -> None:
        super().__init__()
        self.duplicates: list[str] = []
        self.line: int | None = None


def _object(pairs: list[tuple[str, Any]]) -> KeyedObject:
    result = KeyedObject()
    for key, value in pairs:
        if key in result:
            result.duplicates.append(key)
            continue
        result[key] = value
    return result


_DECODER = json.JSONDecoder(object_pairs_hook=_object)
TRACK_LINES_BYTES = 8 * 1024 * 1024  # below this, a document's objects learn their lines


def _line_tracking_decoder(text: str) -> json.JSONDecoder:
    """A decoder whose objects learn the line they start on: the pure-Python scanner, which
    lets an object's start be seen (slower than the C one, so only for smaller documents)."""
    newlines = [m.start() for m in re.finditer("\n", text)]
    decoder = json.JSONDecoder(object_pairs_hook=_object)

    def parse_object(s_and_end: tuple[str, int], *args: Any, **kwargs: Any) -> tuple[Any, int]:
        value, end = JSONObject(s_and_end, *args, **kwargs)
        value.line = bisect.bisect_left(newlines, s_and_end[1] - 1) + 1
        return value, end

    decoder.parse_object = parse_object  # type: ignore[attr-defined]
    decoder.scan_once = py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder


def unpacked(data: bytes, limit: int = MAX_UNPACKED_BYTES) -> bytes:
    """The bytes, or what a gzip file holds (every member of it, as `gzip` reads them); a file
    that unpacks past `limit` is refused as soon as it does, never expanded further."""
    pieces, whole = _inflate(data, limit)
    if not whole:
        raise JsonInputError(TOO_LARGE, f"gzip content unpacks past {limit} bytes")
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _inflate(data: bytes, limit: int) -> tuple[list[bytes], bool]:
    """What `data` unpacks to, as pieces of at most `limit` bytes in all, and whether that is
    all of it. The pieces are kept apart so that a refused bomb is never copied whole."""
    if not data.startswith(GZIP_MAGIC):
        return [data], True
    pieces: list[bytes] = []
    size = 0
    rest = data
    while rest.startswith(GZIP_MAGIC):
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            piece = inflater.decompress(rest, limit + 1 - size)
        except zlib.error as error:
            raise JsonInputError(JSON_SYNTAX, f"not a readable gzip file: {error}") from None
        pieces.append(piece)
        size += len(piece)
        if size > limit or inflater.unconsumed_tail:
            pieces[-1] = piece[: len(piece) - max(0, size - limit)]
            return pieces, False
        if not inflater.eof:
            raise JsonInputError(JSON_SYNTAX, "a gzip file cut short")
        rest = inflater.unused_data
    return pieces, True


def looks_gzipped(data: bytes) -> bool:
    return data.startswith(GZIP_MAGIC)


def head_text(data: bytes, size: int = 64 * 1024) -> str:
    """The start of a file as text, for sniffing: unpacked if gzipped (only as far as needed),
    BOM and leading white space dropped, undecodable bytes replaced."""
    try:
        head = b"".join(_inflate(data, size)[0])
    except JsonInputError:
        head = b""
    return head[:size].decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")


def _text(data: bytes | memoryview) -> str:
    try:
        return bytes(data).decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise JsonInputError(NOT_UTF8, f"not UTF-8: {error.reason} at byte {error.start}") from None


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def too_deep_at(text: str, max_depth: int = MAX_DEPTH) -> int | None:
    """The line where brackets first nest deeper than `max_depth`, or None. Brackets inside
    strings do not count. Parsers recurse once per level (`json`; ruamel's scanner re-checks
    every open flow level), so this is asked before either pays for it."""
    if text.count("[") + text.count("{") <= max_depth:
        return None
    depth = 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > max_depth:
                return text.count("\n", 0, match.start()) + 1
        elif token in "]}":
            depth -= 1
    return None


def depth_guard(text: str, max_depth: int = MAX_DEPTH) -> None:
    """Refuse deep nesting before a parser pays for it."""
    line = too_deep_at(text, max_depth)
    if line is not None:
        raise JsonInputError(TOO_DEEP, f"nesting deeper than {max_depth}", line)


def _parse(text: str, line: int, decoder: json.JSONDecoder = _DECODER) -> Any:
    try:
        return decoder.decode(text)
    except json.JSONDecodeError as error:
        raise JsonInputError(JSON_SYNTAX, error.msg, line + error.lineno - 1) from None
    except RecursionError:
        raise JsonInputError(TOO_DEEP, "nesting too deep to parse", line) from None


def read_document(data: bytes, max_bytes: int = MAX_DOCUMENT_BYTES, *, named: str = "") -> Any:
    """One JSON document (gzip unpacked). Raises JsonInputError; with `named` (the format the
    file was recognized as), its detail names that format: a known format that cannot be read
    says so."""
    if named:
        try:
            return read_document(data, max_bytes)
        except JsonInputError as error:
            raise JsonInputError(error.reason, f"{named}: {error.detail}", error.line) from None
    data = unpacked(data)
    if len(data) > max_bytes:
        raise JsonInputError(TOO_LARGE, f"{len(data)} bytes exceeds the limit of {max_bytes}")
    text = _text(data)
    depth_guard(text)
    decoder = _line_tracking_decoder(text) if len(data) <= TRACK_LINES_BYTES else _DECODER
    return _parse(text, 1, decoder)


@dataclass(frozen=True, slots=True)
class JsonLine:
    """One line of a JSON Lines file: its value, or why it cannot be read."""

    line: int  # 1-based
    text: str  # the line, cut to RAW_LIMIT characters
    value: Any = None
    error: JsonInputError | None = None


def read_lines(data: bytes, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[JsonLine]:
    """The non-blank lines of a JSON Lines file, parsed one by one (gzip unpacked)."""
    data = unpacked(data)
    view = memoryview(data)
    start, number, size = 0, 0, len(data)
    if data.startswith(b"\xef\xbb\xbf"):
        start = 3
    while start < size:
        end = data.find(b"\n", start)
        end = size if end < 0 else end
        number += 1
        chunk = view[start:end]
        start = end + 1
        if len(chunk) > max_line_bytes:
            text = bytes(chunk[:RAW_LIMIT]).decode("utf-8", errors="replace")
            error = JsonInputError(
                TOO_LARGE, f"a line of {len(chunk)} bytes exceeds {max_line_bytes}", number
            )
            yield JsonLine(number, text, error=error)
            continue
        try:
            text = _text(chunk)
        except JsonInputError as error:
            raw = bytes(chunk[:RAW_LIMIT]).decode("utf-8", errors="replace")
            yield JsonLine(number, raw, error=JsonInputError(error.reason, error.detail, number))
            continue
        if not text.strip():
            continue
        try:
            depth_guard(text)
            value = _parse(text, number)
        except JsonInputError as error:
            yield JsonLine(number, text[:RAW_LIMIT], error=error)
            continue
        yield JsonLine(number, text[:RAW_LIMIT], value=value)


def is_json_lines(data: bytes) -> bool:
    """Several JSON values, one per line (the first line is a whole value), rather than one
    document that spans lines."""
    head = head_text(data)
    first, _, rest = head.partition("\n")
    if not rest.strip():
        return False
    try:
        json.loads(first)
    except ValueError:
        return False
    return True


def _flawed(item: Any) -> bool:
    return (isinstance(item, float) and not math.isfinite(item)) or (
        isinstance(item, KeyedObject) and bool(item.duplicates)
    )


def defect(value: Any, max_depth: int = MAX_DEPTH) -> tuple[str, str] | None:
    """Why one record cannot be taken as it stands: a non-finite number or a duplicate key
    anywhere inside it, as (reason, detail); None when it is clean. A clean record (nearly all)
    is walked once without naming paths; the path is named only for a flawed one."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if _flawed(item):
            return _describe(value, max_depth)
        if depth < max_depth:
            if isinstance(item, dict):
                stack.extend((v, depth + 1) for v in item.values())
            elif isinstance(item, list):
                stack.extend((v, depth + 1) for v in item)
    return None


def _describe(value: Any, max_depth: int) -> tuple[str, str] | None:
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return NON_FINITE, f"{item} at {path or '/'} has no JSON value"
        if isinstance(item, KeyedObject) and item.duplicates:
            return DUPLICATE_KEY, f"duplicate key {item.duplicates[0]!r} at {path or '/'}"
        if depth >= max_depth:
            continue
        if isinstance(item, dict):
            stack.extend((v, f"{path}/{escape(k)}", depth + 1) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{path}/{i}", depth + 1) for i, v in enumerate(item))
    return None


def escape(token: str | int) -> str:
    """One JSON pointer token (RFC 6901)."""
    return str(token).replace("~", "~0").replace("/", "~1")


def raw_text(value: Any) -> str:
    """A record's JSON text for a quarantine row, cut to RAW_LIMIT characters."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True, default=str)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text[:RAW_LIMIT]


@dataclass(frozen=True, slots=True)
class Marks:
    """What a format's files show near their start, each with what a file that lacks it lacks:
    how near a file comes to the format (the marks it shows), and what it lacks first."""

    marks: tuple[tuple[re.Pattern[str], str], ...]

    @classmethod
    def of(cls, *marks: tuple[str, str]) -> Marks:
        return cls(tuple((re.compile(pattern), lack) for pattern, lack in marks))

    def found(self, head: str) -> int:
        return sum(1 for pattern, _ in self.marks if pattern.search(head))

    def lacks(self, head: str) -> str | None:
        for pattern, lack in self.marks:
            if not pattern.search(head):
                return lack
        return None
