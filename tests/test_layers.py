"""The floors of the house, read from the code: a source depends on the records contract and the
curation, never on the index or intake built above it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "pipelines" / "sources"
ABOVE_SOURCES = ("pipelines.index", "pipelines.intake")


def imported_modules(text: str, path: Path) -> list[str]:
    """Every module the code of the file at `path` imports, anywhere in it (inside functions and
    TYPE_CHECKING blocks too), relative imports made absolute; `from m import n` counts as m
    and as m.n (n may be a module)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts if path.name == "__init__.py" else parts[:-1]
    package = package[:-1] if package and package[-1] == "__init__" else package
    modules = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            modules += [module, *(f"{module}.{alias.name}" for alias in node.names)]
    return modules


def reaches(module: str, floors: tuple[str, ...]) -> bool:
    return any(module == floor or module.startswith(floor + ".") for floor in floors)


def test_every_form_of_import_is_seen() -> None:
    text = (
        "from typing import TYPE_CHECKING\n"
        "import pipelines.index.tables\n"
        "if TYPE_CHECKING:\n    from pipelines.intake import ledger\n"
        "def f():\n    from ...index import publish\n    from .. import measured\n"
    )
    modules = imported_modules(text, SOURCES / "liger" / "probe.py")
    upward = [m for m in modules if reaches(m, ABOVE_SOURCES)]
    assert "pipelines.index.tables" in upward
    assert "pipelines.intake.ledger" in upward
    assert "pipelines.index.publish" in upward
    assert "pipelines.sources.measured" in modules
    assert not reaches("pipelines.sources.measured", ABOVE_SOURCES)
    assert not reaches("pipelines.indexes", ABOVE_SOURCES)


def test_no_source_imports_the_index_or_intake() -> None:
    files = sorted(SOURCES.rglob("*.py"))
    names = {p.relative_to(SOURCES).as_posix() for p in files}
    # the scan found the sources: the interface, Liger's and a harness's modules
    assert {"__init__.py", "source.py", "liger/normalize.py", "flashinfer/__init__.py"} <= names
    assert len(files) >= 25
    upward = {
        path.relative_to(ROOT).as_posix(): bad
        for path in files
        if (
            bad := [
                m
                for m in imported_modules(path.read_text("utf-8"), path)
                if reaches(m, ABOVE_SOURCES)
            ]
        )
    }
    assert not upward, f"sources import floors above them: {upward}"
