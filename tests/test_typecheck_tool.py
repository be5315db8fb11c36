"""`tools/typecheck.py` (make lint): two type checks of one checkout at once each check a tree
of their own; neither removes the tree the other is reading."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / "tools" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_type_checks_at_once_each_check_a_tree_of_their_own() -> None:
    typecheck = _tool()
    with typecheck.own_tree() as first:
        with typecheck.own_tree() as second:
            assert first != second
            for tree in (first, second):
                assert (tree / "outbox" / "worker").resolve() == ROOT / "worker"
                assert (tree / "outbox" / "views" / "filters.py").is_file()
        # The second run ended: the first's tree is whole, its own is gone.
        assert (first / "outbox" / "worker" / "__init__.py").is_file()
        assert not second.exists()
    assert not first.exists()
