"""Where the manifests of a bundle are: the submission bundle format, a single manifest, or a
stream of manifests, all seen as a flat list of entries with JSON pointers and lines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipelines.records.rules import Reason
from pipelines.sources.bundles.reader import Defect, Document, escape_pointer_token

# Bundle section -> the kind its manifests must have.
SECTIONS: dict[str, str] = {
    "projects": "SoftwareProject",
    "operations": "OperationSpec",
    "workloads": "WorkloadCase",
    "implementations": "ImplementationRevision",
    "runs": "BenchmarkRun",
}
IMPLEMENTATION_KEYS = ("projectSlug", "manifest")
RUN_KEYS = ("run", "protocol", "environment")
RUN_PARTS = {
    "run": "BenchmarkRun",
    "protocol": "BenchmarkProtocol",
    "environment": "ExecutionEnvironment",
}


@dataclass(slots=True)
class Entry:
    """One manifest of the bundle, as authored."""

    pointer: str
    line: int
    value: Any
    expected_kind: str | None
    project_slug: str | None = None
    run_index: int | None = None  # set for the run, protocol and environment of one `runs` item
    defects: list[Defect] = field(default_factory=list)


@dataclass(slots=True)
class Layout:
    entries: list[Entry] = field(default_factory=list)
    # Problems outside any manifest (a misspelt section, a bad `runs` item).
    stray: list[Defect] = field(default_factory=list)


def is_manifest(value: Any) -> bool:
    return isinstance(value, dict) and "kind" in value and "apiVersion" in value


def is_bundle(value: Any) -> bool:
    return isinstance(value, dict) and not is_manifest(value) and any(k in value for k in SECTIONS)


def lay_out(documents: list[Document]) -> Layout:
    layout = Layout()
    many = len(documents) > 1
    for index, document in enumerate(documents):
        prefix = f"/{index}" if many else ""
        _lay_out_document(layout, document, prefix)
        _assign_defects(layout, document.defects)
    return layout


def _lay_out_document(layout: Layout, document: Document, prefix: str) -> None:
    value = document.value
    if is_bundle(value):
        _lay_out_bundle(layout, document, prefix)
    elif isinstance(value, list) and not prefix and all(is_manifest(v) for v in value) and value:
        # A JSON array of manifests reads like a stream.
        for index, item in enumerate(value):
            line = document.line_of(item)
            layout.entries.append(Entry(f"/{index}", line, item, None))
    elif isinstance(value, dict):
        layout.entries.append(Entry(prefix, document.line_of(value), value, None))
    else:
        shown = "empty" if value is None else type(value).__name__
        detail = f"a document must be a bundle or a manifest, not {shown}"
        reason = Reason.EMPTY if value is None else Reason.NOT_A_BUNDLE
        layout.stray.append(Defect(prefix, document.line, reason, detail))


def _lay_out_bundle(layout: Layout, document: Document, prefix: str) -> None:
    bundle: dict[str, Any] = document.value
    for key, items in bundle.items():
        pointer = f"{prefix}/{escape_pointer_token(key)}"
        line = document.line_of(items, document.line_of(bundle))
        if key not in SECTIONS:
            layout.stray.append(
                Defect(pointer, line, Reason.UNKNOWN_FIELD, f"unknown section {key!r}")
            )
            continue
        if items is None:
            continue  # an empty section
        if not isinstance(items, list):
            detail = f"section {key!r} must be a list"
            layout.stray.append(Defect(pointer, line, Reason.SCHEMA_VIOLATION, detail))
            continue
        for index, item in enumerate(items):
            item_pointer = f"{pointer}/{index}"
            item_line = document.line_of(item, line)
            if key == "implementations":
                _lay_out_implementation(layout, item, item_pointer, item_line, document)
            elif key == "runs":
                _lay_out_run(layout, item, item_pointer, item_line, index, document)
            else:
                layout.entries.append(Entry(item_pointer, item_line, item, SECTIONS[key]))


def _unknown_keys(item: dict[str, Any], allowed: tuple[str, ...]) -> list[str]:
    return [key for key in item if key not in allowed]


def _lay_out_implementation(
    layout: Layout, item: Any, pointer: str, line: int, document: Document
) -> None:
    if is_manifest(item):  # a bare manifest is accepted too
        layout.entries.append(Entry(pointer, line, item, "ImplementationRevision"))
        return
    if not isinstance(item, dict) or "manifest" not in item:
        detail = "an implementation must be {projectSlug, manifest}"
        layout.stray.append(Defect(pointer, line, Reason.SCHEMA_VIOLATION, detail))
        return
    manifest = item["manifest"]
    slug = item.get("projectSlug")
    entry = Entry(
        f"{pointer}/manifest",
        document.line_of(manifest, line),
        manifest,
        "ImplementationRevision",
        project_slug=slug if isinstance(slug, str) else None,
    )
    for key in _unknown_keys(item, IMPLEMENTATION_KEYS):
        detail = f"unknown field {key!r}"
        entry.defects.append(
            Defect(f"{pointer}/{escape_pointer_token(key)}", line, Reason.UNKNOWN_FIELD, detail)
        )
    if "projectSlug" in item and not isinstance(slug, str):
        entry.defects.append(
            Defect(
                f"{pointer}/projectSlug",
                line,
                Reason.SCHEMA_VIOLATION,
                "projectSlug must be a string",
            )
        )
    layout.entries.append(entry)


def _lay_out_run(
    layout: Layout, item: Any, pointer: str, line: int, index: int, document: Document
) -> None:
    if not isinstance(item, dict) or "run" not in item:
        detail = "a runs item must be {run, protocol, environment}"
        layout.stray.append(Defect(pointer, line, Reason.SCHEMA_VIOLATION, detail))
        return
    entries = [
        Entry(
            f"{pointer}/{part}",
            document.line_of(item[part], line),
            item[part],
            kind,
            run_index=index,
        )
        for part, kind in RUN_PARTS.items()
        if part in item
    ]
    for key in _unknown_keys(item, RUN_KEYS):
        detail = f"unknown field {key!r}"
        entries[0].defects.append(
            Defect(f"{pointer}/{escape_pointer_token(key)}", line, Reason.UNKNOWN_FIELD, detail)
        )
    layout.entries.extend(entries)


def _assign_defects(layout: Layout, defects: list[Defect]) -> None:
    """Give each reader defect to the manifest that contains it; the rest are stray."""
    for defect in defects:
        owner = None
        for entry in layout.entries:
            inside = defect.pointer == entry.pointer or defect.pointer.startswith(
                entry.pointer + "/"
            )
            if inside and (owner is None or len(entry.pointer) > len(owner.pointer)):
                owner = entry
        if owner is None:
            layout.stray.append(defect)
        else:
            owner.defects.append(defect)
