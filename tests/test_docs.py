"""The README and docs/ say what the code does: every worker flag is listed in the README with
its real default, every listed flag exists, and every repository path they name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from outbox.table import Table
from outbox.worker.settings import CONVERTERS, WorkerSettings, build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]
# Defaults that are not values but a description of where the value comes from.
DESCRIBED = {
    "dsn": "PG* variables",
    "owner": "hostname-pid",
    "metrics_port": "off",
    "rate_limit": "off",
    "cloudevents_source": "/outbox/<table>",
}


def worker_flag_rows() -> dict[str, str]:
    """flag name -> its default as the README's worker table writes it."""
    text = README.read_text()
    table = text[text.index("| flag (env `OUTBOX_…`) | default |") :]
    table = table[: table.index("\n\n")]
    rows: dict[str, str] = {}
    for line in table.splitlines()[2:]:
        flags_cell, default_cell = line.split("|")[1:3]
        flags = re.findall(r"`(--[a-z-]+)`", flags_cell)
        defaults = [d.strip("`") for d in re.findall(r"`[^`]+`|[^,`]+", default_cell.strip())]
        defaults = [d.strip() for d in defaults if d.strip()]
        if len(defaults) == 1:
            defaults *= len(flags)
        assert len(defaults) == len(flags), line
        rows.update(zip(flags, defaults, strict=True))
    return rows


def test_every_worker_flag_is_in_the_readme_and_nothing_else():
    parser_flags = {
        option
        for action in build_parser()._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }
    assert set(worker_flag_rows()) == parser_flags


@pytest.mark.parametrize("name", ["dsn", "table", "publisher", *CONVERTERS])
def test_the_readme_gives_each_worker_flag_its_real_default(name):
    written = worker_flag_rows()["--" + name.replace("_", "-")]
    if name in DESCRIBED:
        assert written == DESCRIBED[name]
        return
    default = getattr(WorkerSettings(dsn=""), name)
    convert = CONVERTERS.get(name, {"table": Table.parse, "publisher": str}.get(name))
    assert convert is not None
    assert convert(written) == default


# A path written from the repository's root starts with one of its top-level folders; one
# inside a longer path or a URL (after `/`, `.`, a letter) is someone else's.
_TOP_LEVEL = (
    *("outbox", "worker", "controller", "tui", "demo", "tests", "bench", "docs"),
    *("charts", "crds", "examples", "tools", ".ci"),
)
_ROOTED = re.compile(r"(?<![\w./-])((?:" + "|".join(map(re.escape, _TOP_LEVEL)) + r")/[\w.*/-]*)")
# A Markdown link's target: a file relative to the document that links to it.
_LINK = re.compile(r"\]\(([^)\s]+)")


def named_paths(doc: Path) -> list[tuple[int, str, Path]]:
    """(line, path as written, where it points) for every repository path `doc` names."""
    named = []
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        for written in _ROOTED.findall(line):
            written = written.rstrip(".")  # the end of a sentence
            named.append((number, written, ROOT / written))
        for target in _LINK.findall(line):
            if "://" in target or target.startswith(("#", "mailto:")):
                continue
            written = target.split("#")[0]
            named.append((number, written, (doc.parent / written).resolve()))
    return named


def _exists(path: Path) -> bool:
    if "*" in path.name:  # `tests/k8s/test_operator*.py`: at least one file matches
        return any(path.parent.glob(path.name))
    return path.exists() and path.resolve().is_relative_to(ROOT)


def test_the_docs_name_only_paths_that_exist():
    named = [(doc, *entry) for doc in DOCS for entry in named_paths(doc)]
    assert len(named) > 50  # the patterns still find what the docs name
    missing = [
        f"{doc.relative_to(ROOT)}:{line}: {written}"
        for doc, line, written, path in named
        if not _exists(path)
    ]
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)
