"""A PostgreSQL cluster of a test's own: initdb in a temporary folder, its own port.

For tests that stop and start the database: they must never restart the machine's
cluster, which other tests and other work use. Skips, saying why, where PostgreSQL's
server programs are not installed or will not start.
"""

import glob
import os
import pwd
import shutil
import subprocess
from pathlib import Path
from types import TracebackType

import pytest

from tests.conftest import free_port


def _bindir() -> Path | None:
    """Where initdb and pg_ctl live: the newest of Debian's versioned folders, or the PATH."""
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: int(Path(p).parent.parent.name),
    )
    if versions:
        return Path(versions[-1]).parent
    found = shutil.which("pg_ctl")
    return Path(found).parent if found and shutil.which("initdb") else None


class PrivatePostgres:
    """``with PrivatePostgres(folder) as pg:`` a running cluster at ``pg.url``; ``pg.ctl``
    stops and starts it; it is stopped and its folder left for pytest to clean."""

    def __init__(self, folder: Path) -> None:
        bindir = _bindir()
        if bindir is None:
            pytest.skip("PostgreSQL's server programs (initdb, pg_ctl) are not installed")
        self.bindir = bindir
        self.folder = folder
        self.data = folder / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        # The server refuses to run as root: run it as the postgres account where we are root.
        self.user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root and there is no postgres account to run the server")
            self.user = "postgres"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    def ctl(self, action: str, *extra: str) -> None:
        done = self._run(
            "pg_ctl", action, "-D", str(self.data), "-w", "-l", str(self.folder / "log"), *extra
        )
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl {action} failed: {done.stderr or done.stdout}")

    def __enter__(self) -> "PrivatePostgres":
        self.folder.mkdir(parents=True)
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)
            # runuser keeps the test's working folder; make sure the account can pass
            # through the temporary folders above this one.
            for parent in self.folder.parents:
                if str(parent).startswith(("/tmp", "/var/tmp")) and parent != Path("/tmp"):
                    os.chmod(parent, os.stat(parent).st_mode | 0o011)
        made = self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
        )
        if made.returncode != 0:
            pytest.skip(f"initdb could not make a private cluster: {made.stderr.strip()[-300:]}")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.folder}'\nfsync = off\n"
            )
        self.ctl("start")  # -w: returns once the server accepts connections
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.ctl("stop", "-m", "immediate")
