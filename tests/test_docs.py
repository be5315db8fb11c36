"""The README's tables say what the code does: every worker flag is listed with its real
default, and every listed flag exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from outbox.table import Table
from outbox.worker.settings import CONVERTERS, WorkerSettings, build_parser

README = Path(__file__).resolve().parent.parent / "README.md"
# Defaults that are not values but a description of where the value comes from.
DESCRIBED = {"dsn": "PG* variables", "owner": "hostname-pid", "metrics_port": "off"}


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
