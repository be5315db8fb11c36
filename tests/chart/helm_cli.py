"""`helm`, the command line, for the tests: the commands users type (install, upgrade, test,
rollback, uninstall, template, status, history, get values) with the flags the docs use,
carried out by Helm 4's own library (helm-python-sdk: Helm's Go code, not a copy of it).

`install_helm(bin_dir)` writes a `helm` executable there that runs this module under the
name `helm`, so that the library (which names its field manager after the program, as the
real CLI does) applies as `helm`; with that folder first on PATH, a test runs a command
from the docs as written, through a shell. Output follows the real CLI's; failures print
`Error: ...` on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import site
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from helm_python import _native

TESTS = Path(__file__).resolve().parents[1]
# `helm`'s own default for waiting and for `helm test` (5m0s).
DEFAULT_TIMEOUT = 300


def install_helm(bin_dir: Path) -> Path:
    """A `helm` executable in `bin_dir` (argv[0] is `helm`, as the real binary's)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "helm"
    # Named `helm`, Python no longer finds its virtualenv by its own name: the path says.
    path = os.pathsep.join([str(TESTS), *site.getsitepackages()])
    script.write_text(
        "#!/bin/bash\n"
        f"export PYTHONPATH={shlex.quote(path)}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        f'exec -a helm {shlex.quote(sys.executable)} -m chart.helm_cli "$@"\n'
    )
    script.chmod(0o755)
    return script


def _seconds(duration: str) -> int:
    """A Go duration (`5m0s`, `90s`, `2m`) in whole seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise SystemExit(f'Error: invalid argument "{duration}" for "--timeout" flag')
    return max(1, round(sum(float(n) * units[u] for n, u in parts)))


def _merge(into: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Helm's values merge: maps merge key by key, anything else replaces."""
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def _values(args: argparse.Namespace) -> dict[str, Any]:
    """-f files in order, then --set and --set-string in order, as the CLI composes them."""
    values: dict[str, Any] = {}
    for path in args.values or []:
        _merge(values, helm.values_from_yaml(Path(path).read_text()))
    for kind, expression in args.sets or []:
        parse = helm.parse_set_string if kind == "set" else helm.parse_set_string_values
        _merge(values, parse(expression))
    return values


class _Sets(argparse.Action):
    """--set and --set-string, kept in the order given (they may override each other)."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        sets = getattr(namespace, "sets", None) or []
        sets.append(("set" if option == "--set" else "set-string", value))
        namespace.sets = sets


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="helm", exit_on_error=False)
    parser.add_argument("-n", "--namespace", default=None)
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--kube-context", default=None)
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, *aliases: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, aliases=list(aliases))
        sub.add_argument("-n", "--namespace", default=argparse.SUPPRESS)
        sub.add_argument("--timeout", default=None)
        sub.add_argument("--debug", action="store_true")
        if name in ("install", "upgrade", "rollback"):
            # Helm 4 applies server-side; this takes fields other managers own.
            sub.add_argument("--force-conflicts", action="store_true")
        return sub

    def with_values(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("-f", "--values", action="append")
        sub.add_argument("--set", action=_Sets, dest="sets")
        sub.add_argument("--set-string", action=_Sets, dest="sets")

    install = command("install")
    install.add_argument("name")
    install.add_argument("chart")
    install.add_argument("--create-namespace", action="store_true")
    install.add_argument("--wait", nargs="?", const="watcher", default=None)
    with_values(install)
    upgrade = command("upgrade")
    upgrade.add_argument("name")
    upgrade.add_argument("chart")
    upgrade.add_argument("-i", "--install", action="store_true")
    upgrade.add_argument("--create-namespace", action="store_true")
    upgrade.add_argument("--reuse-values", action="store_true")
    upgrade.add_argument("--reset-values", action="store_true")
    upgrade.add_argument("--wait", nargs="?", const="watcher", default=None)
    with_values(upgrade)
    template = command("template")
    template.add_argument("name")
    template.add_argument("chart")
    template.add_argument("--skip-tests", action="store_true")
    with_values(template)
    test = command("test")
    test.add_argument("name")
    test.add_argument("--logs", action="store_true")
    rollback = command("rollback")
    rollback.add_argument("name")
    rollback.add_argument("revision", nargs="?", type=int, default=None)
    rollback.add_argument("--wait", nargs="?", const="watcher", default=None)
    uninstall = command("uninstall", "delete", "un")
    uninstall.add_argument("name")
    uninstall.add_argument("--keep-history", action="store_true")
    status = command("status")
    status.add_argument("name")
    history = command("history")
    history.add_argument("name")
    get = command("get")
    get.add_argument("what", choices=["values", "manifest"])
    get.add_argument("name")
    get.add_argument("-a", "--all", action="store_true")
    return parser


def _forced(
    config: helm.Config,
    action: str,
    args: argparse.Namespace,
    options: dict[str, Any],
    values: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """install, upgrade or rollback with `force_conflicts`, a key of the library's options
    (Helm's --force-conflicts) that the Python binding does not pass on."""
    options = {
        k: v for k, v in {**options, "force_conflicts": True}.items() if v not in (None, False)
    }
    if action == "helm_rollback":
        _native.call_status(action, config._raw(), args.name, json.dumps(options))
        return {}
    handle, ref = helm.Config._chart_args(args.chart)
    payload = _native.call_string(
        action,
        config._raw(),
        helm.Config._context_arg(None),
        handle,
        ref,
        args.name,
        json.dumps(values or {}),
        json.dumps(options),
    )
    result: dict[str, Any] = json.loads(payload)
    return result


def _is_test_hook(text: str) -> bool:
    """A rendered template that is a `helm test` hook (what `--skip-tests` leaves out);
    `test-success` is the hook's older name, which Helm still reads as `test`."""
    for obj in yaml.safe_load_all(text):
        annotations = (obj or {}).get("metadata", {}).get("annotations") or {}
        hooks = str(annotations.get("helm.sh/hook", "")).replace(" ", "").split(",")
        if {"test", "test-success"} & set(hooks):
            return True
    return False


def _summary(release: dict[str, Any], *, upgraded: bool = False) -> str:
    lines = [f'Release "{release["name"]}" has been upgraded. Happy Helming!'] if upgraded else []
    lines += [
        f"NAME: {release['name']}",
        f"LAST DEPLOYED: {release.get('deployed_at', '')}",
        f"NAMESPACE: {release['namespace']}",
        f"STATUS: {release['status']}",
        f"REVISION: {release['revision']}",
    ]
    if release.get("notes"):
        lines += ["NOTES:", release["notes"].rstrip("\n")]
    return "\n".join(lines) + "\n"


def run(argv: list[str]) -> str:
    """One command; its standard output (raises helm.HelmError or SystemExit on failure)."""
    args = _parser().parse_args(argv)
    namespace = args.namespace or os.environ.get("HELM_NAMESPACE") or "default"
    timeout = _seconds(args.timeout) if args.timeout else DEFAULT_TIMEOUT
    if args.command == "template":
        with helm.Chart.load(args.chart) as chart:
            rendered = chart.render(values=_values(args), name=args.name, namespace=namespace)
        return "".join(
            f"---\n# Source: {path}\n{text.strip()}\n"
            for path, text in sorted(rendered.items())
            if path.endswith((".yaml", ".yml"))
            and text.strip()
            and not (args.skip_tests and _is_test_hook(text))
        )
    with helm.Config(
        kubeconfig_path=args.kubeconfig or os.environ.get("KUBECONFIG"),
        kube_context=args.kube_context,
        namespace=namespace,
    ) as config:
        if args.command == "install" and args.force_conflicts:
            release = _forced(
                config,
                "helm_install",
                args,
                {
                    "namespace": namespace,
                    "create_namespace": args.create_namespace,
                    "wait": args.wait,
                    "timeout_seconds": timeout,
                },
                _values(args),
            )
            return _summary(release)
        if args.command == "install":
            release = config.install(
                args.chart,
                args.name,
                _values(args),
                namespace=namespace,
                create_namespace=args.create_namespace,
                wait=args.wait,
                timeout=timeout,
            )
            return _summary(release)
        if args.command == "upgrade":
            if args.install and not config.list(name_filter=f"^{re.escape(args.name)}$"):
                release = config.install(
                    args.chart,
                    args.name,
                    _values(args),
                    namespace=namespace,
                    create_namespace=args.create_namespace,
                    wait=args.wait,
                    timeout=timeout,
                )
                return f'Release "{args.name}" does not exist. Installing it now.\n' + _summary(
                    release
                )
            if args.force_conflicts:
                release = _forced(
                    config,
                    "helm_upgrade",
                    args,
                    {
                        "namespace": namespace,
                        "reuse_values": args.reuse_values,
                        "reset_values": args.reset_values,
                        "wait": args.wait,
                        "timeout_seconds": timeout,
                    },
                    _values(args),
                )
                return _summary(release, upgraded=True)
            release = config.upgrade(
                args.chart,
                args.name,
                _values(args),
                namespace=namespace,
                reuse_values=args.reuse_values,
                reset_values=args.reset_values,
                wait=args.wait,
                timeout=timeout,
            )
            return _summary(release, upgraded=True)
        if args.command == "test":
            result = config.test(args.name, timeout=timeout, logs=args.logs)
            out = _summary(
                result.get(
                    "release",
                    {"name": args.name, "namespace": namespace, "status": "", "revision": ""},
                )
            )
            return out + (result.get("logs") or "")
        if args.command == "rollback" and args.force_conflicts:
            _forced(
                config,
                "helm_rollback",
                args,
                {"version": args.revision, "wait": args.wait, "timeout_seconds": timeout},
            )
            return "Rollback was a success! Happy Helming!\n"
        if args.command == "rollback":
            config.rollback(args.name, version=args.revision, wait=args.wait, timeout=timeout)
            return "Rollback was a success! Happy Helming!\n"
        if args.command in ("uninstall", "delete", "un"):
            result = config.uninstall(args.name, keep_history=args.keep_history, timeout=timeout)
            return (result.get("info") or "") + f'release "{args.name}" uninstalled\n'
        if args.command == "status":
            return _summary(config.status(args.name))
        if args.command == "history":
            rows = ["REVISION\tSTATUS\tCHART\tAPP VERSION\tDESCRIPTION"]
            for entry in config.history(args.name):
                version = f"{entry.get('chart_name')}-{entry.get('chart_version')}"
                rows.append(
                    f"{entry['revision']}\t{entry['status']}\t{version}\t"
                    f"{entry.get('app_version', '')}\t{entry.get('description', '')}"
                )
            return "\n".join(rows) + "\n"
        if args.what == "values":
            values = config.get_values(args.name, all_values=args.all)
            return "USER-SUPPLIED VALUES:\n" + str(yaml.safe_dump(values))
        return str(config.status(args.name).get("manifest", ""))


def main(argv: list[str] | None = None) -> int:
    try:
        sys.stdout.write(run(sys.argv[1:] if argv is None else argv))
    except (helm.HelmError, argparse.ArgumentError, OSError) as exc:
        sys.stderr.write(f"Error: {exc}\n")
        return 1
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
