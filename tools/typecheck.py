"""Type-check the installed import names (`outbox`, `outbox.worker`, ...) with mypy.

The repository keeps each component in a top-level folder that the build maps into the
`outbox` namespace (pyproject's package-dir); mypy cannot follow setuptools' editable-install
finder, so this builds the same mapping as a tree of symlinks and checks `-p outbox` there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"


def build_tree() -> None:
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    shutil.rmtree(TREE, ignore_errors=True)
    root = TREE / "outbox"
    root.mkdir(parents=True)
    for name, folder in package_dir.items():
        source = ROOT / folder
        if name == "outbox":
            for item in source.iterdir():
                if item.suffix in (".py", ".typed"):
                    (root / item.name).symlink_to(item)
                elif (item / "__init__.py").is_file():  # a layer's folder: outbox/views, ...
                    (root / item.name).symlink_to(item, target_is_directory=True)
        else:
            (TREE / name.replace(".", "/")).symlink_to(source, target_is_directory=True)


def main() -> None:
    build_tree()
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    sys.exit(subprocess.call([*command, "-p", "outbox"], cwd=TREE))


if __name__ == "__main__":
    main()
