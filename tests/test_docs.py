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


DEPLOY = ROOT / "docs" / "deploy.md"


def command_blocks(doc: Path = DEPLOY) -> list[list[str]]:
    """The commands of each ```sh block of `doc`, in order: a command and its `\\`
    continuations joined into one line, comments dropped, runs of blanks made one."""
    blocks: list[list[str]] = []
    block: list[str] | None = None
    for line in doc.read_text().splitlines():
        fence = line.strip()
        if block is None and fence == "```sh":
            block = []
        elif block is not None and fence == "```":
            text = "\n".join(block).replace("\\\n", " ")
            commands = [re.sub(r"\s+#.*$|^#.*$", "", c.strip()) for c in text.splitlines()]
            blocks.append([re.sub(r"\s+", " ", c) for c in commands if c])
            block = None
        elif block is not None:
            block.append(line)
    return blocks


def _runners() -> dict[str, tuple[str, ...]]:
    """Which test runs which of docs/deploy.md's commands, as written (each named by its first
    words); each of these tests runs its commands by looking them up in the doc."""
    from chart.test_release import HELM_STORY, KUBECTL_STORY
    from image.test_deploy_docs import BUILD, LOCK, PUSH, RUN

    release, image = "tests/chart/test_release.py::", "tests/image/test_deploy_docs.py::"
    return {
        release + "test_install_serve_upgrade_test_rollback_uninstall": HELM_STORY,
        release + "test_the_kubectl_install_path": KUBECTL_STORY,
        image + "test_the_docs_build_commands_build_the_image": BUILD,
        image + "test_the_docs_push_command_pushes_the_image": PUSH,
        image + "test_the_docs_run_commands_run_the_image": RUN,
        image + "test_the_docs_lock_command_writes_the_lock": LOCK,
    }


def test_every_command_block_of_the_deploy_docs_is_run_by_a_test():
    blocks = command_blocks()
    assert len(blocks) >= 8 and all(blocks), blocks  # the parser still finds the blocks
    runners = _runners()
    uncovered = [
        f"block {number}: {command}"
        for number, block in enumerate(blocks, 1)
        for command in block
        if not any(command.startswith(start) for starts in runners.values() for start in starts)
    ]
    assert not uncovered, "docs/deploy.md commands that no test runs:\n" + "\n".join(uncovered)
    commands = [command for block in blocks for command in block]
    prose = " ".join(DEPLOY.read_text().split())  # a command written inline, in `code`
    gone = [
        f"{test}: {start}"
        for test, starts in runners.items()
        for start in starts
        if not any(command.startswith(start) for command in commands) and f"`{start}" not in prose
    ]
    assert not gone, "commands tests run that docs/deploy.md no longer has:\n" + "\n".join(gone)
    for test in runners:  # each named test exists
        path, name = test.split("::")
        assert f"\ndef {name}(" in (ROOT / path).read_text(), test
