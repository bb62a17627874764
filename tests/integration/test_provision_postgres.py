"""The private PostgreSQL cluster of ``scripts/provision_postgres.sh``: password authentication, an application
role that is not a superuser, and the passwords in files only their owner reads (issue 46, §5).

Real ``initdb`` and ``postgres`` (the machine's binaries, as root run by the unprivileged ``tandem`` user) on a
throw-away directory and port: the machine's own server on 5432 and the checkout's ``.tandem/pg`` are not touched
(``TANDEM_PG_DIR``, ``TANDEM_PG_PORT``, ``TANDEM_PG_SKIP_LOCAL=1``).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg2
import pytest

from _ha import free_port

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "provision_postgres.sh"


class CommandLines(threading.Thread):
    """The command lines of every process while it runs (what ``ps`` shows every user)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: set[str] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for process in psutil.process_iter(["cmdline"]):
                self.seen.add(" ".join(process.info["cmdline"] or []))

    def __enter__(self) -> CommandLines:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()


class Cluster:
    """The script run on one directory and port."""

    def __init__(self, directory: Path, port: int, script: Path = SCRIPT) -> None:
        self.directory, self.port, self.script = directory, port, script
        self.env = {**os.environ, "TANDEM_PG_DIR": str(directory), "TANDEM_PG_PORT": str(port),
                    "TANDEM_PG_SKIP_LOCAL": "1"}
        self.env.pop("TANDEM_DATABASE_URL", None)
        self.env.pop("PGPASSFILE", None)

    def run(self, command: str = "ensure") -> str:
        done = subprocess.run(["bash", str(self.script), command], env=self.env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"provision_postgres.sh {command} failed:\n{done.stderr}"
        return done.stdout.strip()

    @property
    def real_directory(self) -> Path:
        return self.directory.resolve()  # as root: a symlink to /var/lib/tandem/pg-<hash>


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path / "pg", free_port())
    try:
        yield made
    finally:
        made.run("destroy")


def as_user(url: str, user: str, password: str | None = None, database: str = "postgres") -> str:
    parts = urlsplit(url)
    credentials = user if password is None else f"{user}:{password}"
    return urlunsplit(parts._replace(netloc=f"{credentials}@{parts.hostname}:{parts.port}", path=f"/{database}"))


def refused(url: str) -> str:
    """The error of a connection that must fail (no password file is offered)."""
    with pytest.raises(psycopg2.OperationalError) as failure:
        psycopg2.connect(url, connect_timeout=5, passfile="/nonexistent").close()
    return str(failure.value)


def test_a_new_private_cluster_asks_for_passwords_and_tandem_connects_as_a_role_that_is_not_a_superuser(
        cluster: Cluster) -> None:
    with CommandLines() as lines:
        url = cluster.run("ensure")
    parts = urlsplit(url)
    assert (parts.username, parts.hostname, parts.port, parts.path) == ("tandem", "127.0.0.1", cluster.port, "/tandem")
    password = parts.password
    assert password and len(password) >= 24, "the URL carries the application role's password"
    assert not [line for line in lines.seen if password in line], "a password on a command line"

    with psycopg2.connect(url) as conn, conn.cursor() as cursor:
        cursor.execute("""SELECT rolsuper, rolcreaterole, rolreplication, rolbypassrls FROM pg_roles
                          WHERE rolname = current_user""")
        assert cursor.fetchone() == (False, False, False, False)
        cursor.execute("SELECT pg_catalog.pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'tandem'")
        assert cursor.fetchone() == ("tandem",), "the application role owns its database"
        cursor.execute("CREATE SCHEMA probe; CREATE TABLE probe.t (id int); DROP SCHEMA probe CASCADE")
        cursor.execute("SHOW password_encryption")
        assert cursor.fetchone() == ("scram-sha-256",)
    conn.close()

    assert "password authentication failed" in refused(as_user(url, "tandem", "wrong", "tandem"))
    assert "no password supplied" in refused(as_user(url, "postgres"))
    assert "no password supplied" in refused(as_user(url, "tandem", database="tandem"))

    data = cluster.real_directory / "data"
    rules = [line.split() for line in (data / "pg_hba.conf").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert rules and {rule[-1] for rule in rules} == {"scram-sha-256"}, rules
    secrets = [path for path in cluster.real_directory.iterdir() if path.is_file()
               and password in path.read_text(errors="replace")]
    assert [path.name for path in secrets] == ["pgpass"]
    assert stat.S_IMODE(secrets[0].stat().st_mode) == 0o600

    cluster.run("stop")
    assert cluster.run("ensure") == url, "a restart keeps the role's password"


def test_a_cluster_left_behind_by_a_killed_run_is_never_started_as_the_next_one_of_the_same_directory(
        cluster: Cluster) -> None:
    """As root the cluster lives under /var/lib/tandem, linked from its directory. A run killed before ``destroy``
    leaves it there; a test's temporary directory of the same path (reused after a reboot) gets a new cluster."""
    if os.geteuid() != 0:
        pytest.skip("only root's clusters live outside their directory")
    url = cluster.run("ensure")
    left_behind = cluster.real_directory
    assert left_behind != cluster.directory and left_behind.is_relative_to("/var/lib/tandem")
    try:
        with psycopg2.connect(url) as conn, conn.cursor() as cursor:
            cursor.execute("CREATE TABLE of_the_killed_run (id int)")
        conn.close()
        cluster.run("stop")
        cluster.directory.unlink()  # the temporary directory went; the cluster it linked to stayed

        url = cluster.run("ensure")
        assert cluster.real_directory != left_behind
        with psycopg2.connect(url) as conn, conn.cursor() as cursor:
            cursor.execute("SELECT to_regclass('of_the_killed_run')")
            assert cursor.fetchone() == (None,), "the killed run's cluster was started again"
        conn.close()
    finally:
        postmaster = left_behind / "data" / "postmaster.pid"
        if postmaster.is_file():  # still running when the test failed before stopping it (or started it again)
            os.kill(int(postmaster.read_text().split()[0]), signal.SIGQUIT)
        subprocess.run(["rm", "-rf", str(left_behind)], check=True)


def test_a_private_cluster_made_with_trust_is_secured_by_the_next_set_up(tmp_path: Path) -> None:
    """A cluster an earlier version made (trust, Tandem as ``postgres``), with Tandem's tables in it: the next
    ``ensure`` gives the roles passwords, makes the application role own the tables, and ends trust."""
    old_script = tmp_path / "old" / "scripts" / "provision_postgres.sh"
    old_script.parent.mkdir(parents=True)
    # The script as it was before scram (commit 67da7fa^), kept as a file: a clean clone may be shallow.
    old_script.write_text((REPO / "tests" / "support" / "data" / "provision_postgres_before_scram.sh").read_text())
    old = Cluster(tmp_path / "pg", free_port(), script=old_script)
    new = Cluster(tmp_path / "pg", old.port)
    try:
        old_url = old.run("ensure")
        assert urlsplit(old_url).username == "postgres" and urlsplit(old_url).password is None
        with psycopg2.connect(old_url) as conn, conn.cursor() as cursor:
            cursor.execute("CREATE SCHEMA tandem; CREATE TABLE tandem.leases (id bigserial PRIMARY KEY, holder text)")
            cursor.execute("INSERT INTO tandem.leases (holder) VALUES ('node-a')")
        conn.close()

        url = new.run("ensure")
        assert urlsplit(url).username == "tandem" and urlsplit(url).password
        with psycopg2.connect(url) as conn, conn.cursor() as cursor:
            cursor.execute("INSERT INTO tandem.leases (holder) VALUES ('node-b') RETURNING id")
            assert cursor.fetchone() == (2,), "the application role owns the tables and their sequences"
            cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            assert cursor.fetchone() == (False,)
        conn.close()
        assert "no password supplied" in refused(old_url)
        assert new.run("ensure") == url
    finally:
        new.run("destroy")


def test_a_link_it_did_not_make_is_never_followed_and_its_target_keeps_its_owner(tmp_path: Path) -> None:
    """Issue 60: ``.tandem/pg`` (here the test's directory) already a symbolic link to a directory elsewhere, which
    the script did not make: ``ensure`` refuses it, naming both, and neither chowns, fills nor starts anything there;
    ``destroy`` removes the link only."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "keep.txt").write_text("not the cluster's")
    owner = (elsewhere.stat().st_uid, elsewhere.stat().st_gid)
    made = Cluster(tmp_path / "pg", free_port())
    made.directory.symlink_to(elsewhere)
    done = subprocess.run(["bash", str(SCRIPT), "ensure"], env=made.env, capture_output=True, text=True, timeout=120)
    assert (elsewhere.stat().st_uid, elsewhere.stat().st_gid) == owner, "the link's target was chowned"
    assert done.returncode != 0 and not done.stdout, done.stdout
    assert f"{made.directory} is a symbolic link to {elsewhere}" in done.stderr, done.stderr
    assert sorted(path.name for path in elsewhere.iterdir()) == ["keep.txt"]
    made.run("destroy")
    assert not made.directory.is_symlink() and (elsewhere / "keep.txt").is_file()
