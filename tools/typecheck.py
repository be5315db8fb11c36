"""Type-check the installed import names (`outbox`, `outbox.worker`, ...) with mypy.

The repository keeps each component in a top-level folder that the build maps into the
`outbox` namespace (pyproject's package-dir); mypy cannot follow setuptools' editable-install
finder, so this builds the same mapping as a tree of symlinks and checks `-p outbox` there.
Each run builds its tree in a directory of its own under `build/` (mypy's cache with it),
removed when it ends: two checks of one checkout at once never remove each other's tree.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"


def build_tree(tree: Path) -> None:
    """The package-dir mapping as symlinks under `tree` (an empty directory)."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    root = tree / "outbox"
    root.mkdir()
    for name, folder in package_dir.items():
        source = ROOT / folder
        if name == "outbox":
            for item in source.iterdir():
                if item.suffix in (".py", ".typed"):
                    (root / item.name).symlink_to(item)
                elif (item / "__init__.py").is_file():  # a layer's folder: outbox/views, ...
                    (root / item.name).symlink_to(item, target_is_directory=True)
        else:
            (tree / name.replace(".", "/")).symlink_to(source, target_is_directory=True)


@contextmanager
def own_tree() -> Iterator[Path]:
    """A tree of this run's own, built, and removed when the run ends."""
    BUILD.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="typecheck-", dir=BUILD) as tree:
        build_tree(Path(tree))
        yield Path(tree)


def main() -> None:
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    with own_tree() as tree:
        code = subprocess.call([*command, "-p", "outbox"], cwd=tree)
    sys.exit(code)


if __name__ == "__main__":
    main()
