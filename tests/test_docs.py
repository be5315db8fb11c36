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


def command_blocks(doc: Path = DEPLOY, fence: str = "```sh") -> list[list[str]]:
    """The commands of each ```sh block of `doc` (or of each block opened by `fence`), in
    order: a command and its `\\` continuations joined into one line, comments dropped, runs
    of blanks made one."""
    blocks: list[list[str]] = []
    block: list[str] | None = None
    for line in doc.read_text().splitlines():
        opened = line.strip()
        if block is None and opened == fence:
            block = []
        elif block is not None and opened == "```":
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


# -- the docs' Python examples run with the install they name ----------------------------------

PYPROJECT = ROOT / "pyproject.toml"
# What the receiving page's examples may import besides their install: the framework or client
# the application already has (the page's words), which is what the helper module a block
# imports uses itself (`outbox.receiver.aiohttp` imports aiohttp), and for the ASGI endpoint,
# which imports none, the ASGI frameworks the page names.
ASGI_FRAMEWORKS = {"fastapi", "starlette"}
_PIP_INSTALL = re.compile(r"pip install ([^`\n]+)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement(spec: str) -> tuple[str, list[str]]:
    """A requirement's distribution name and extras."""
    found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", spec)
    assert found, spec
    return _canonical(found[1]), [e.strip() for e in (found[2] or "").split(",") if e.strip()]


def installed_by(extras: list[str]) -> set[str]:
    """The distributions `pip install 'outbox-dispatcher[extras]'` asks for by name (the
    plain install's and each extra's, following extras that name other extras)."""
    import tomllib

    project = tomllib.loads(PYPROJECT.read_text())["project"]
    names: set[str] = set()
    pending, seen = [None, *extras], set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        specs = (
            project["dependencies"] if extra is None else project["optional-dependencies"][extra]
        )
        for spec in specs:
            name, more = _requirement(spec)
            if name == _canonical(project["name"]):
                pending.extend(more)
            else:
                names.add(name)
    return names


def _imported(code: str) -> set[str]:
    """The top-level modules a block imports (absolute imports)."""
    import ast

    tree = ast.parse(code.replace("…", "..."))  # the docs' ellipsis stands for a value
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


def _distribution(module: str) -> set[str]:
    """Who provides a top-level module: the installed distributions, or one of its name."""
    from importlib.metadata import packages_distributions

    return {_canonical(d) for d in packages_distributions().get(module, [module])}


def _brought_by_helpers(modules: set[str]) -> set[str]:
    """What the `outbox.receiver` modules among `modules` import themselves: the framework
    or client each one uses, which the application has."""
    brought: set[str] = set()
    for module in modules:
        if module.startswith("outbox.receiver."):
            source = ROOT / "receiver" / (module.rsplit(".", 1)[1] + ".py")
            if source.exists():
                for name in _imported(source.read_text()):
                    brought |= _distribution(name.split(".")[0])
        if module == "outbox.receiver.asgi":
            brought |= ASGI_FRAMEWORKS
    return brought


def foreign_imports(doc: Path) -> list[str]:
    """Each import of `doc`'s Python examples that the install the page names does not
    bring: not the standard library, not the project, not a distribution that `pip install`
    commands written on the page install (the project with its extras, or others)."""
    import sys

    text = doc.read_text()
    extras: list[str] = []
    named: set[str] = set()
    for command in _PIP_INSTALL.findall(text):
        for word in command.split():
            word = word.strip("'\"")
            if word.startswith("-"):
                continue
            name, more = _requirement(word)
            if name == "outbox-dispatcher":
                extras.extend(more)
            else:
                named.add(name)
    allowed = installed_by(extras) | named
    foreign = []
    for number, code in enumerate(re.findall(r"```python\n(.*?)```", text, flags=re.S), 1):
        modules = _imported(code)
        brought = _brought_by_helpers(modules)
        for module in sorted(modules):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top == "outbox":
                continue
            if not _distribution(top) & (allowed | brought):
                foreign.append(f"{doc.relative_to(ROOT)} block {number}: {module}")
    return foreign


def test_the_docs_examples_import_only_what_the_install_they_name_brings():
    """A reader who runs the page's `pip install` can run its examples: e.g. receiving.md's
    helpers take connections from a psycopg_pool pool, so the `receiver` extra installs it."""
    assert "psycopg-pool" in installed_by(["worker"])  # the resolution still reads pyproject
    assert _imported("from psycopg_pool import AsyncConnectionPool") == {"psycopg_pool"}
    blocks = sum(len(re.findall(r"```python\n", doc.read_text())) for doc in DOCS)
    assert blocks >= 10, blocks  # the examples are still found
    foreign = [line for doc in DOCS for line in foreign_imports(doc)]
    assert not foreign, "imports the install a page names does not bring:\n" + "\n".join(foreign)


# -- namespaces: made before anything is put in them -------------------------------------------

EXAMPLES = ROOT / "examples"
# Every cluster has it.
_GIVEN_NAMESPACES = {"default"}


def _manifest_namespaces(command: str) -> set[str]:
    """The namespaces of the objects `kubectl apply -f FILE…` creates, from the files."""
    import yaml

    namespaces: set[str] = set()
    if " apply " not in f" {command} ":
        return namespaces
    for path in re.findall(r"(?:-f|--filename)[ =](\S+)", command):
        if (ROOT / path).is_file():
            for obj in yaml.safe_load_all((ROOT / path).read_text()):
                if obj and obj.get("metadata", {}).get("namespace"):
                    namespaces.add(obj["metadata"]["namespace"])
    return namespaces


def namespaces_used_before_made(commands: list[str]) -> list[str]:
    """Each command, in the order a reader types them, that puts something in (or reads from)
    a namespace no earlier command made: `kubectl create namespace NS`, or a `helm` command's
    `--create-namespace`. A namespace is used by `-n`/`--namespace` and by the objects of the
    files `kubectl apply -f` names."""
    made = set(_GIVEN_NAMESPACES)
    unmade = []
    for command in commands:
        words = command.split()
        if not words or words[0] not in ("kubectl", "helm"):
            continue
        flagged = set(re.findall(r"(?:^|\s)(?:-n|--namespace)[ =](\S+)", command))
        if words[:3] == ["kubectl", "create", "namespace"] and len(words) > 3:
            made.add(words[3])
            continue
        if words[0] == "helm" and "--create-namespace" in words:
            made |= flagged
            continue
        missing = (flagged | _manifest_namespaces(command)) - made
        if missing:
            unmade.append(f"{command}  (namespace {', '.join(sorted(missing))})")
    return unmade


def example_headers() -> dict[Path, list[str]]:
    """The commands each example's header comment tells a reader to run."""
    return {
        path: [
            m.strip() for m in re.findall(r"^#\s+(kubectl .*?)(?:\s+#.*)?$", path.read_text(), re.M)
        ]
        for path in sorted(EXAMPLES.rglob("*.yaml"))
    }


def test_every_namespace_is_made_before_a_command_uses_it():
    """docs/deploy.md's story, its kind quick start and each example's header make the
    namespace before they apply to it (`kubectl -n shop apply` in a fresh cluster only says
    `namespaces "shop" not found`)."""
    stories = {
        "docs/deploy.md": [c for block in command_blocks() for c in block],
        "docs/deploy.md, kind": [c for block in command_blocks(fence=KIND) for c in block],
        **{str(path.relative_to(ROOT)): commands for path, commands in example_headers().items()},
    }
    assert sum(1 for commands in stories.values() if any(" apply " in c for c in commands)) >= 7
    unmade = [f"{name}: {line}" for name, cmds in stories.items()
              for line in namespaces_used_before_made(cmds)]  # fmt: skip
    assert not unmade, "namespaces used before they are made:\n" + "\n".join(unmade)


def test_the_namespace_check_sees_each_way_of_using_one():
    assert namespaces_used_before_made(
        [
            "helm install r charts/x --namespace ops --create-namespace",
            "kubectl -n ops get pods",
            "kubectl -n shop apply -f examples/http.yaml",
            "kubectl apply -f examples/log.yaml",
            "kubectl create namespace shop",
            "kubectl --namespace=shop get obd",
            "helm upgrade r charts/x -n billing",
        ]
    ) == [
        "kubectl -n shop apply -f examples/http.yaml  (namespace shop)",
        "kubectl apply -f examples/log.yaml  (namespace sandbox)",
        "helm upgrade r charts/x -n billing  (namespace billing)",
    ]


# -- the kind quick start: the release story's commands, on kind -------------------------------

# The quick start's blocks: shell, but for a kind cluster, which no test machine runs, so they
# are checked against the release test's commands instead (below) and kept out of the blocks
# that test runs.
KIND = "```sh kind"
RELEASE_TEST = ROOT / "tests" / "chart" / "test_release.py"
# The demo's own steps: the throwaway database and API, the migration pod, the backlog.
_DEMO_OWN = re.compile(r"^kubectl -n shop (run|exec|wait) ")


def release_commands() -> list[str]:
    """What tests/chart/test_release.py runs: docs/deploy.md's commands of its story (found
    by their first words, as it finds them) and each command line it types itself (up to the
    first value it computes)."""
    import ast

    from chart.test_release import HELM_STORY, documented

    run = [c for c in documented() if any(c.startswith(start) for start in HELM_STORY)]
    for node in ast.walk(ast.parse(RELEASE_TEST.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "sh" or not node.args:
            continue
        line = node.args[0]
        while isinstance(line, ast.BinOp):  # "kubectl … -p " + shlex.quote(…)
            line = line.left
        if isinstance(line, ast.JoinedStr):  # f"kubectl … {value}"
            line = line.values[0] if line.values else line
        if isinstance(line, ast.Constant) and isinstance(line.value, str):
            run.append(line.value.rstrip("\"' "))
    return run


def _helm_shape(command: str) -> tuple[list[str], list[str]]:
    """A helm command without its `--set` values: the words, and the keys it sets."""
    words = command.split()
    keys, kept, at = [], [], 0
    while at < len(words):
        if words[at] in ("--set", "--set-string") and at + 1 < len(words):
            keys.append(words[at + 1].split("=", 1)[0])
            at += 2
            continue
        kept.append(words[at])
        at += 1
    return kept, keys


def _image(command: str) -> str:
    """The image a helm command's `--set image.repository=… --set image.tag=…` names."""
    sets = dict(re.findall(r"--set (image\.\w+)=(\S+)", command))
    return f"{sets['image.repository']}:{sets['image.tag']}"


def test_the_kind_quick_start_runs_the_release_story_on_kind():
    blocks = command_blocks(fence=KIND)
    commands = [c for block in blocks for c in block]
    assert len(blocks) >= 5, blocks  # the quick start is there, and found
    story = release_commands()
    assert any(c.startswith("helm install") for c in story)  # the story is still found

    # The image built is the one loaded into kind and the one the chart runs, with Docker and
    # with podman.
    [install] = [c for c in commands if c.startswith("helm install")]
    image = _image(install)
    assert f"docker build -t {image} ." in commands
    assert f"kind load docker-image {image} --name outbox" in commands
    assert f"podman build -t {image} ." in commands
    archive = next(c for c in commands if c.startswith("podman save"))
    assert archive.endswith(f" {image}")
    [tar] = re.findall(r"-o (\S+)", archive)
    assert f"kind load image-archive {tar} --name outbox" in commands
    assert commands.index("export KIND_EXPERIMENTAL_PROVIDER=podman") < commands.index(archive)
    assert sum(c == "kind create cluster --name outbox" for c in commands) == 2
    assert commands[-1] == "kind delete cluster --name outbox"

    unmatched = []
    for command in commands:
        if command.startswith("helm "):
            # The story's command with that verb, the same words but the values it sets.
            verb = command.split()[1]
            [ours] = [c for c in story if c.startswith(f"helm {verb} ")][:1] or [""]
            if _helm_shape(command) != _helm_shape(ours):
                unmatched.append(f"{command}\n    the story: {ours}")
        elif command.startswith("kubectl "):
            if _DEMO_OWN.match(command):
                continue
            if not any(
                command == c or (command.startswith(c) and len(c.split()) >= 4) for c in story
            ):
                unmatched.append(command)
        for path in re.findall(r"-f (\S+\.yaml)", command):
            assert (ROOT / path).is_file(), command
    assert not unmatched, "quick start commands the release test does not run:\n" + "\n".join(
        unmatched
    )
    # The story's own steps are all there: the namespace, the example, the two values the
    # example leaves to the reader (the DSN, the API), the table the example names.
    for step in (
        "kubectl create namespace shop",
        "kubectl -n shop apply -f examples/http.yaml",
        "kubectl -n shop patch secret orders-db -p",
        "kubectl -n shop patch obd orders --type=merge -p",
        "kubectl -n outbox-system rollout status deployment/outbox-dispatcher",
        "kubectl -n shop get obd",
    ):
        assert any(c.startswith(step) for c in commands), step
        assert any(c.startswith(step) or step.startswith(c) for c in story), step
    [migrate] = [c for c in commands if "outbox migrate" in c]
    [documented_migrate] = [c for c in story if c.startswith("outbox migrate")]
    assert migrate.endswith(f"-- {documented_migrate}")
    assert f"--image={image}" in migrate


# The receiving helpers and the one call that write into an inbox table, and where it is set.
_INBOX_CALL = re.compile(r"\b(?:inbox\.record|inbox_handler|InboxEndpoint|NatsInbox|KafkaInbox)\(")
_DEFAULT_INBOX = "outbox_inbox"


def _call_text(code: str, start: int) -> str:
    """The call opened at `start` (its parenthesis) up to the one that closes it."""
    depth = 0
    for end in range(start, len(code)):
        depth += {"(": 1, ")": -1}.get(code[end], 0)
        if depth == 0:
            return code[start : end + 1]
    return code[start:]


def inbox_tables_out_of_step(doc: Path) -> list[str]:
    """In each section (a heading to the next) that shows `outbox inbox migrate`, the inbox
    calls of its Python whose table (`table=`, else the default) is none the section's
    migrate makes: the first delivery would fail on a missing relation."""
    wrong = []
    for section in re.split(r"\n#+ ", doc.read_text()):
        made = {
            (re.findall(r"--table\s+(\S+)", line) or [_DEFAULT_INBOX])[0]
            for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S)
            for line in block.splitlines()
            if line.startswith("outbox inbox migrate")
        }
        if not made:
            continue
        for code in re.findall(r"```python\n(.*?)```", section, flags=re.S):
            for call in _INBOX_CALL.finditer(code):
                text = _call_text(code, call.end() - 1)
                table = re.findall(r"\btable\s*=\s*\"([^\"]+)\"", text) or [_DEFAULT_INBOX]
                if table[0] not in made:
                    wrong.append(f"{doc.name}: {call.group(0)} writes to {table[0]}, not {made}")
    return wrong


def test_every_inbox_snippet_writes_to_the_table_its_section_migrates():
    assert [w for doc in DOCS for w in inbox_tables_out_of_step(doc)] == []


def test_the_inbox_table_check_sees_a_call_left_to_the_default(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "## Receive\n\n```sh\noutbox inbox migrate --table billing_inbox\n```\n\n"
        '```python\nif inbox.record(conn, consumer="billing", message_id=key):\n    pass\n'
        'InboxEndpoint(apply, consumer="billing",\n    table="billing_inbox")\n```\n'
    )
    assert inbox_tables_out_of_step(page) == [
        "page.md: inbox.record( writes to outbox_inbox, not {'billing_inbox'}"
    ]
