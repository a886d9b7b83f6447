"""A safe reader for authored YAML and JSON: bounded, strict, and YAML 1.2 core schema only.

Why not a stock loader: PyYAML (YAML 1.1) turns `2026-08-01T12:00:00Z` into a datetime and breaks
digests; stock loaders expand aliases eagerly (a "billion laughs" document exhausts memory) and
recurse per nesting level. Here ruamel.yaml's pure-Python parser produces *events* and values are
built from them without recursion, so every bound (depth, aliases, expanded nodes) is checked before
any cost is paid. Aliases share the anchored Python object; the expanded node count is computed
arithmetically, so refusing an explosive document costs as much as reading its text.

JSON text goes through the standard `json` parser (fast, exact numbers) with duplicate-key
detection; JSON is YAML, so a document that only looks like JSON (`{a: 1}`) falls back to YAML.

Problems that spoil only part of a document (a duplicate key, a custom tag, a non-string key) are
returned as `Defect`s with a JSON pointer, so a bundle can quarantine the manifest that holds them
and keep the rest. Problems that make the text unreadable raise `ReadError`.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from json.decoder import JSONObject  # type: ignore[attr-defined]
from json.scanner import py_make_scanner  # type: ignore[attr-defined]
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml import events as ev
from ruamel.yaml.error import YAMLError

from pipelines.records.rules import Reason
from pipelines.sources.json_input import too_deep_at

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_ALIASES = 10_000
DEFAULT_MAX_NODES = 2_000_000


@dataclass(frozen=True, slots=True)
class ReadLimits:
    max_bytes: int = DEFAULT_MAX_BYTES
    max_depth: int = DEFAULT_MAX_DEPTH  # nested mappings/sequences
    max_aliases: int = DEFAULT_MAX_ALIASES  # alias uses in the whole stream
    max_nodes: int = DEFAULT_MAX_NODES  # nodes after expanding every alias


DEFAULT_LIMITS = ReadLimits()


class ReadError(ValueError):
    """The text cannot be read at all (syntax, limits, encoding)."""

    def __init__(self, reason: str, detail: str, line: int = 1) -> None:
        super().__init__(f"{reason}: {detail} (line {line})")
        self.reason = reason
        self.detail = detail
        self.line = line


@dataclass(frozen=True, slots=True)
class Defect:
    """A problem confined to one place of an otherwise readable document."""

    pointer: str  # JSON pointer into the document
    line: int  # 1-based
    reason: str
    detail: str


@dataclass(slots=True)
class Document:
    value: Any
    line: int  # 1-based line where the document starts
    defects: list[Defect] = field(default_factory=list)
    # 1-based start line of each mapping/sequence, by id(); valid while `value` is alive.
    lines: dict[int, int] = field(default_factory=dict)

    def line_of(self, container: Any, default: int | None = None) -> int:
        return self.lines.get(id(container), self.line if default is None else default)


@dataclass(slots=True)
class ReadResult:
    format: str  # "yaml" | "json"
    documents: list[Document]


def escape_pointer_token(token: str | int) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer_of(path: list[str | int]) -> str:
    return "".join("/" + escape_pointer_token(p) for p in path)


def read_documents(data: bytes | str, limits: ReadLimits = DEFAULT_LIMITS) -> ReadResult:
    """Read every document of a YAML stream or a JSON text. Raises ReadError."""
    text = decode_text(data, limits)
    if text.lstrip().startswith(("{", "[")):
        try:
            return ReadResult("json", [read_json(text, limits)])
        except _NotJson as not_json:
            # JSON is YAML: `{a: 1}` is a YAML flow mapping. Report the JSON error only when the
            # text is not YAML either.
            try:
                return ReadResult("yaml", list(read_yaml(text, limits)))
            except ReadError:
                raise not_json.error from None
    return ReadResult("yaml", list(read_yaml(text, limits)))


def decode_text(data: bytes | str, limits: ReadLimits) -> str:
    size = len(data.encode("utf-8")) if isinstance(data, str) else len(data)
    if size > limits.max_bytes:
        raise ReadError(Reason.TOO_LARGE, f"{size} bytes exceeds the limit of {limits.max_bytes}")
    if isinstance(data, str):
        return data.removeprefix("\ufeff")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ReadError(
            Reason.ENCODING, f"not UTF-8: {error.reason} at byte {error.start}"
        ) from None


# --- JSON -------------------------------------------------------------------------------------


class _NotJson(Exception):
    def __init__(self, error: ReadError) -> None:
        super().__init__(str(error))
        self.error = error


def bracket_depth_guard(text: str, limits: ReadLimits) -> None:
    """Refuse deep bracket nesting before a parser pays for it (json_input's rule): anything
    that nests 64 brackets deep is not a bundle anyway."""
    line = too_deep_at(text, limits.max_depth)
    if line is not None:
        raise ReadError(Reason.TOO_DEEP, f"nesting deeper than {limits.max_depth}", line)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")  # NaN/Infinity have no canonical form


def read_json(text: str, limits: ReadLimits) -> Document:
    bracket_depth_guard(text, limits)
    starts: dict[int, int] = {}  # id(container) -> character offset
    duplicates: list[tuple[int, str]] = []  # (id(mapping), key)

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                duplicates.append((id(result), key))
                continue  # first one wins; the defect quarantines the enclosing manifest
            result[key] = value
        return result

    decoder = json.JSONDecoder(object_pairs_hook=pairs_hook, parse_constant=_reject_constant)

    def parse_object(s_and_end: tuple[str, int], *args: Any, **kwargs: Any) -> tuple[Any, int]:
        value, end = JSONObject(s_and_end, *args, **kwargs)
        starts[id(value)] = s_and_end[1] - 1
        return value, end

    decoder.parse_object = parse_object  # type: ignore[attr-defined]
    decoder.scan_once = py_make_scanner(decoder)  # type: ignore[attr-defined]
    try:
        value = decoder.decode(text)
    except ValueError as error:
        line = error.lineno if isinstance(error, json.JSONDecodeError) else 1
        raise _NotJson(ReadError(Reason.JSON_SYNTAX, str(error), line)) from None
    offsets = _line_offsets(text)
    document = Document(value, 1)
    document.lines = {key: _line_at(offsets, pos) for key, pos in starts.items()}
    if duplicates:
        paths = _paths_by_id(value)
        for mapping_id, key in duplicates:
            path = [*paths.get(mapping_id, []), key]
            line = document.lines.get(mapping_id, 1)
            document.defects.append(
                Defect(pointer_of(path), line, Reason.DUPLICATE_KEY, f"duplicate key {key!r}")
            )
    return document


def _line_offsets(text: str) -> list[int]:
    return [m.start() for m in re.finditer("\n", text)]


def _line_at(newline_offsets: list[int], pos: int) -> int:
    return bisect.bisect_left(newline_offsets, pos) + 1


def _walk(value: Any) -> Iterator[tuple[list[str | int], Any]]:
    """Every (path, value) of a JSON-like tree, iteratively (depth is already bounded)."""
    stack: list[tuple[list[str | int], Any]] = [([], value)]
    while stack:
        path, item = stack.pop()
        yield path, item
        if isinstance(item, dict):
            stack.extend(([*path, k], v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend(([*path, i], v) for i, v in enumerate(item))


def _paths_by_id(value: Any) -> dict[int, list[str | int]]:
    return {id(item): path for path, item in _walk(value) if isinstance(item, dict)}


# --- YAML -------------------------------------------------------------------------------------

# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution), plain scalars only.
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT10 = re.compile(r"^[-+]?[0-9]+$")
_INT8 = re.compile(r"^0o[0-7]+$")
_INT16 = re.compile(r"^0x[0-9a-fA-F]+$")
_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_INF = re.compile(r"^[-+]?\.(?:inf|Inf|INF)$")
_NAN = re.compile(r"^\.(?:nan|NaN|NAN)$")

_CORE = "tag:yaml.org,2002:"
_SCALAR_TAGS = {f"{_CORE}{t}" for t in ("str", "int", "float", "bool", "null")}
_ALLOWED_TAGS = _SCALAR_TAGS | {f"{_CORE}map", f"{_CORE}seq", "!"}


def resolve_plain(text: str) -> Any:
    """The value of a plain (unquoted, untagged) scalar under the YAML 1.2 core schema."""
    if _NULL.match(text):
        return None
    if _BOOL.match(text):
        return text.lower() == "true"
    if _INT10.match(text):
        return int(text)
    if _INT8.match(text):
        return int(text[2:], 8)
    if _INT16.match(text):
        return int(text[2:], 16)
    if _FLOAT.match(text):
        return float(text)
    if _INF.match(text):
        return -math.inf if text.startswith("-") else math.inf
    if _NAN.match(text):
        return math.nan
    return text


class _Invalid:
    """A scalar whose tag could not be honoured (the defect is already recorded)."""


_INVALID = _Invalid()


def _tagged_scalar(tag: str, text: str) -> Any:
    if tag in (f"{_CORE}str", "!"):
        return text
    resolved = resolve_plain(text)
    expected = {
        f"{_CORE}int": int,
        f"{_CORE}float": float,
        f"{_CORE}bool": bool,
        f"{_CORE}null": type(None),
    }[tag]
    if expected is float and isinstance(resolved, int) and not isinstance(resolved, bool):
        return float(resolved)
    if type(resolved) is not expected:
        return _INVALID
    return resolved


@dataclass(slots=True)
class _Frame:
    container: dict[str, Any] | list[Any]
    anchor: str | None
    nodes: int = 1
    key: Any = None
    expecting_key: bool = True
    skip_value: bool = False  # the key was bad: drop the value that follows

    def slot(self) -> str | int:
        if isinstance(self.container, list):
            return len(self.container)
        return str(self.key)


class _DocumentBuilder:
    """Builds one document's value from parser events, enforcing the limits as it goes."""

    def __init__(self, limits: ReadLimits, budget: list[int], line: int, prefix: list[str | int]):
        self.limits = limits
        self.budget = budget  # [aliases used, nodes expanded] across the whole stream
        self.document = Document(None, line)
        self.prefix = prefix
        self.stack: list[_Frame] = []
        self.anchors: dict[str, tuple[Any, int]] = {}  # name -> (value, expanded node count)
        self.done = False

    def path(self) -> list[str | int]:
        return [*self.prefix, *(f.slot() for f in self.stack)]

    def defect(
        self, reason: str, detail: str, line: int, path: list[str | int] | None = None
    ) -> None:
        pointer = pointer_of(self.path() if path is None else path)
        self.document.defects.append(Defect(pointer, line, reason, detail))

    def count(self, nodes: int, line: int) -> None:
        self.budget[1] += nodes
        if self.budget[1] > self.limits.max_nodes:
            raise ReadError(
                Reason.TOO_MANY_ALIASES,
                f"more than {self.limits.max_nodes} nodes once aliases are expanded",
                line,
            )

    def feed(self, event: Any) -> None:
        line = event.start_mark.line + 1
        if isinstance(event, ev.ScalarEvent):
            self.scalar(event, line)
        elif isinstance(event, ev.AliasEvent):
            self.alias(event, line)
        elif isinstance(event, ev.MappingStartEvent | ev.SequenceStartEvent):
            self.start(event, line)
        elif isinstance(event, ev.MappingEndEvent | ev.SequenceEndEvent):
            frame = self.stack.pop()
            if frame.anchor is not None:
                self.anchors[frame.anchor] = (frame.container, frame.nodes)
            self.add(frame.container, frame.nodes, line)

    def check_tag(self, tag: str | None, allowed: set[str], line: int) -> bool:
        if tag is None or tag in allowed:
            return True
        self.defect(Reason.CUSTOM_TAG, f"tag {tag!r} is not allowed", line)
        return False

    def scalar(self, event: Any, line: int) -> None:
        tag = event.tag
        value: Any
        if not self.check_tag(tag, _SCALAR_TAGS | {"!"}, line):
            value = _INVALID
        elif tag is not None:
            value = _tagged_scalar(tag, event.value)
            if value is _INVALID:
                self.defect(Reason.CUSTOM_TAG, f"{event.value!r} is not a valid {tag}", line)
        elif event.style is None:
            value = resolve_plain(event.value)
        else:
            value = event.value
        self.count(1, line)
        if event.anchor is not None:
            self.anchors[event.anchor] = (value, 1)
        self.add(value, 1, line)

    def alias(self, event: Any, line: int) -> None:
        self.budget[0] += 1
        if self.budget[0] > self.limits.max_aliases:
            raise ReadError(
                Reason.TOO_MANY_ALIASES, f"more than {self.limits.max_aliases} aliases", line
            )
        try:
            value, nodes = self.anchors[event.anchor]
        except KeyError:
            raise ReadError(
                Reason.YAML_SYNTAX, f"alias *{event.anchor} names no complete anchor", line
            ) from None
        self.count(nodes, line)
        self.add(value, nodes, line)

    def start(self, event: Any, line: int) -> None:
        if len(self.stack) >= self.limits.max_depth:
            raise ReadError(Reason.TOO_DEEP, f"nesting deeper than {self.limits.max_depth}", line)
        is_map = isinstance(event, ev.MappingStartEvent)
        allowed = {f"{_CORE}map" if is_map else f"{_CORE}seq", "!"}
        self.check_tag(event.tag, allowed, line)
        container: dict[str, Any] | list[Any] = {} if is_map else []
        self.document.lines[id(container)] = line
        self.count(1, line)
        self.stack.append(_Frame(container, event.anchor))

    def add(self, value: Any, nodes: int, line: int) -> None:
        if not self.stack:
            self.document.value = None if value is _INVALID else value
            self.done = True
            return
        frame = self.stack[-1]
        frame.nodes += nodes
        if isinstance(frame.container, list):
            frame.container.append(None if value is _INVALID else value)
            return
        if frame.expecting_key:
            frame.expecting_key = False
            frame.skip_value = False
            if not isinstance(value, str):
                if value is not _INVALID:
                    shown = (
                        "a mapping or sequence" if isinstance(value, dict | list) else repr(value)
                    )
                    parent = [*self.prefix, *(f.slot() for f in self.stack[:-1])]
                    detail = f"key {shown} is not a string"
                    self.defect(Reason.NON_STRING_KEY, detail, line, [*parent, shown])
                frame.skip_value = True
            elif value in frame.container:
                parent = [*self.prefix, *(f.slot() for f in self.stack[:-1])]
                self.defect(
                    Reason.DUPLICATE_KEY, f"duplicate key {value!r}", line, [*parent, value]
                )
                frame.skip_value = True  # first one wins
            frame.key = value
            return
        frame.expecting_key = True
        if not frame.skip_value:
            frame.container[frame.key] = None if value is _INVALID else value


def read_yaml(text: str, limits: ReadLimits) -> Iterator[Document]:
    bracket_depth_guard(text, limits)
    parser = YAML(typ="safe", pure=True)
    budget = [0, 0]
    builders: list[_DocumentBuilder] = []
    builder: _DocumentBuilder | None = None
    line = 1
    try:
        for event in parser.parse(text):
            line = event.start_mark.line + 1
            if isinstance(event, ev.DocumentStartEvent):
                builder = _DocumentBuilder(limits, budget, line, [])
                builders.append(builder)
            elif isinstance(event, ev.DocumentEndEvent | ev.StreamStartEvent | ev.StreamEndEvent):
                continue
            elif builder is not None:
                builder.feed(event)
    except YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = mark.line + 1 if mark is not None else line
        problem = getattr(error, "problem", None) or str(error)
        raise ReadError(Reason.YAML_SYNTAX, str(problem).strip(), where) from None
    except RecursionError:
        raise ReadError(Reason.TOO_DEEP, "nesting too deep for the parser", line) from None
    if len(builders) > 1:
        # In a stream, pointers are prefixed by the document's index.
        for index, item in enumerate(builders):
            item.document.defects = [
                Defect(f"/{index}{d.pointer}", d.line, d.reason, d.detail)
                for d in item.document.defects
            ]
    for item in builders:
        if item.done:
            yield item.document
