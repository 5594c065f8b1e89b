"""A PostgreSQL server of the local cluster's own, for MLflow's store: Debian's binaries, one data folder.

Many trials log at once; sqlite serialises them behind one file lock, PostgreSQL does not.  The
server listens on 127.0.0.1 only and asks for a password (scram) that lives in a 0600 ``pgpass``
file, so no password appears on a command line.  PostgreSQL refuses to run as root: under root
it runs as the system user ``postgres`` (Debian's package makes it), in a folder that user can reach.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

USER = "mocolab"
DATABASE = "mlflow"
INSTALL_HINT = ("install PostgreSQL (Debian/Ubuntu: apt-get install -y postgresql) or use --backend sqlite")


def find_bindir() -> Path | None:
    """The folder holding initdb and pg_ctl: on PATH, else Debian's /usr/lib/postgresql/<newest>/bin."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
                      key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    return versions[-1].parent if versions else None


def _run_as() -> str | None:
    """None, or the system user to run the server as when we are root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise ValueError("--backend postgres: PostgreSQL does not run as root and there is no 'postgres' user; "
                         + INSTALL_HINT) from None
    return "postgres"


def _as_user(user: str) -> list[str]:
    """The command prefix that runs a program as ``user`` (util-linux runuser; often in /usr/sbin, off PATH)."""
    found = shutil.which("runuser") or next((p for p in ("/usr/sbin/runuser", "/sbin/runuser") if Path(p).exists()),
                                            None)
    if found is None:
        raise ValueError("--backend postgres under root needs `runuser` (util-linux) to run PostgreSQL as user "
                         "postgres; " + INSTALL_HINT)
    return [found, "-u", user, "--"]


def _reachable_by(user: str, folder: Path) -> bool:
    return subprocess.run(_as_user(user) + ["test", "-x", str(folder)], capture_output=True).returncode == 0


def data_folder(cluster_dir: Path) -> Path:
    """``<cluster dir>/postgres``, or, under root when user postgres cannot reach that folder (a home of
    mode 0700), a folder of that user's own named after the cluster folder."""
    wanted = cluster_dir / "postgres"
    user = _run_as()
    if user is None:
        return wanted
    cluster_dir.mkdir(parents=True, exist_ok=True)
    if _reachable_by(user, cluster_dir):  # it can enter the folder: its own data folder goes inside
        return wanted
    home = Path(pwd.getpwnam(user).pw_dir)
    return home / f"mocolab-{hashlib.sha256(str(cluster_dir).encode()).hexdigest()[:12]}"


@dataclass
class Postgres:
    data: Path  # the server's data folder (owned by the user it runs as)
    port: int
    bindir: Path
    pgpass: Path  # libpq password file of the cluster's user, mode 0600

    @classmethod
    def locate(cls, cluster_dir: Path, port: int) -> "Postgres":
        bindir = find_bindir()
        if bindir is None:
            raise ValueError(f"--backend postgres: no PostgreSQL server binaries (initdb, pg_ctl) found; "
                             f"{INSTALL_HINT}")
        return cls(data_folder(cluster_dir), port, bindir, cluster_dir / "pgpass")

    @property
    def user(self) -> str | None:
        return _run_as()

    def uri(self) -> str:
        """MLflow's backend store URI: no password in it (libpq reads it from PGPASSFILE)."""
        return f"postgresql+psycopg2://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    def env(self) -> dict[str, str]:
        return {"PGPASSFILE": str(self.pgpass)}

    def _cmd(self, *args: str) -> list[str]:
        user = self.user
        return (_as_user(user) if user else []) + list(args)

    def initialised(self) -> bool:
        return (self.data / "PG_VERSION").exists() and self.pgpass.exists()

    def init(self) -> None:
        """A new data folder with user ``mocolab`` (a random password) and database ``mlflow``."""
        password = secrets.token_urlsafe(24)
        self.data.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data, 0o700)
        with tempfile.NamedTemporaryFile("w", delete=False, prefix="pgpw", dir="/tmp") as f:
            f.write(password + "\n")
        try:
            if self.user:
                shutil.chown(self.data, self.user, self.user)
                shutil.chown(f.name, self.user)
            res = subprocess.run(self._cmd(str(self.bindir / "initdb"), "-D", str(self.data), "-U", USER,
                                           "--pwfile", f.name, "--auth-host=scram-sha-256", "--auth-local=peer",
                                           "-E", "UTF8", "--locale=C"),
                                 capture_output=True, text=True)
        finally:
            os.unlink(f.name)
        if res.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
        fd = os.open(self.pgpass, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"127.0.0.1:*:*:{USER}:{password}\n")
        self.start()
        res = subprocess.run([str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER,
                              DATABASE], capture_output=True, text=True, env={**os.environ, **self.env()})
        if res.returncode != 0:
            raise RuntimeError(f"createdb failed: {res.stderr[-2000:]}")

    def start(self, marker: dict[str, str] | None = None) -> None:
        log = self.data / "server.log"
        res = subprocess.run(self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(log), "-w",
                                       "-t", "60", "-o", f"-h 127.0.0.1 -p {self.port} -k {self.data}", "start"),
                             capture_output=True, text=True, env={**os.environ, **(marker or {})})
        if res.returncode != 0:
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"PostgreSQL did not start on 127.0.0.1:{self.port}:\n{res.stderr[-1000:]}{tail}")

    def running(self) -> bool:
        if not (self.data / "PG_VERSION").exists():
            return False
        return subprocess.run(self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "status"),
                              capture_output=True).returncode == 0

    def stop(self) -> None:
        if self.running():
            subprocess.run(self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w",
                                     "stop"), capture_output=True, text=True)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.data, ignore_errors=True)
        self.pgpass.unlink(missing_ok=True)
