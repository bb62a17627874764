"""The venv runs the pinned pip and setuptools (issue 9, item 14), and one consistent pyspark (issue 24, §4)."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints.txt"


def test_pip_and_setuptools_are_the_pinned_versions() -> None:
    pins = dict(line.split("==") for line in CONSTRAINTS.read_text().splitlines()
                if line.startswith(("pip==", "setuptools==")))
    assert set(pins) == {"pip", "setuptools"}
    assert {name: version(name) for name in pins} == pins


def _jars_version() -> str:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    cores = sorted(jars.glob("spark-core_*.jar"))
    assert len(cores) == 1, f"expected one spark-core jar in {jars}, found {[c.name for c in cores]}"
    return cores[0].stem.rsplit("-", 1)[1]


def test_pyspark_python_files_are_the_release_of_its_jars() -> None:
    """pyspark and pyspark-client (the Spark provider's dependency) write the same Python files: one release
    of both, or ``pyspark.__version__`` and the data source workers disagree with the JVM (issue 24, §4)."""
    import pyspark

    assert pyspark.__version__ == version("pyspark") == version("pyspark-client") == _jars_version()


def test_every_file_pyspark_and_pyspark_client_share_is_the_one_both_recorded() -> None:
    """A file both wheels install holds the bytes of both records (a mixed pair leaves one wheel's copy)."""
    import base64
    import hashlib
    from importlib.metadata import distribution

    def recorded(name: str) -> dict[str, str]:
        return {str(f): f.hash.value for f in distribution(name).files or () if f.hash is not None}

    pyspark, client = recorded("pyspark"), recorded("pyspark-client")
    shared = sorted(set(pyspark) & set(client))
    assert shared, "pyspark-client installs pyspark's Python files: expected shared files"
    root = Path(distribution("pyspark").locate_file(""))
    differing = []
    for path in shared:
        digest = base64.urlsafe_b64encode(hashlib.sha256((root / path).read_bytes()).digest()).rstrip(b"=").decode()
        if not digest == pyspark[path] == client[path]:
            differing.append(path)
    assert not differing, f"{len(differing)} shared files differ between the wheels, e.g. {differing[:5]}"


def test_pip_check_finds_no_broken_requirement() -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
