"""``gl.Env``: a job's Python environment, reusable across submits (docs/environments.md).

An :class:`Env` is what a user writes; :meth:`Env.spec` turns it into the wire's
:class:`~gpulayer.contracts.EnvSpec`: it reads the requirements file, and builds
and uploads local packages (a ``.whl`` as it is, a project folder built into a
wheel here first) so a worker that cannot see this machine installs them.
:meth:`Env.from_job` pins a finished job's exact versions for a re-run.
"""

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import pydantic

from gpulayer import contracts, errors


class Uploads(Protocol):
    """What :meth:`Env.spec` needs of a connection: a blob upload."""

    def upload_blob(self, data: bytes) -> contracts.BlobRef: ...


#: Options a requirements file may hold, and the EnvSpec field each fills.
_FILE_OPTIONS = {
    "-i": "index_url", "--index-url": "index_url",
    "--extra-index-url": "extra_index_urls",
    "-f": "find_links", "--find-links": "find_links",
}  # fmt: skip


class Env:
    """A job's Python environment: built on the worker with uv, cached there by a hash
    of what it holds, and reused by every job that asks for the same.

    Parameters
    ----------
    pip
        Requirements (PEP 508 strings), e.g. ``["transformers==4.46", "datasets"]``.
    requirements
        A requirements file here, read now (``-r``, ``--index-url``,
        ``--extra-index-url`` and ``--find-links`` lines are understood).
    index_url, extra_index_urls, find_links
        Where packages come from (default: the worker's pip configuration).
        ``find_links`` may name folders on the worker.
    local_packages
        Wheels (``.whl``) or project folders here; folders are built into wheels,
        and all are uploaded with the job and installed into its env.
    isolated
        A clean env: the worker's own packages are not visible (default: layered on
        them, so the worker's torch stays importable).
    python
        ``"3.12"``: the env's interpreter (default: the worker's).

    Examples
    --------
    >>> env = gl.Env(pip=["six==1.17.0"])
    >>> gl.submit("python -c 'import six'", environment=env)
    """

    def __init__(
        self,
        pip: Sequence[str] | str | None = None,
        *,
        requirements: str | os.PathLike[str] | None = None,
        index_url: str | None = None,
        extra_index_urls: Sequence[str] = (),
        find_links: Sequence[str] = (),
        local_packages: Sequence[str | os.PathLike[str]] = (),
        isolated: bool = False,
        python: str | None = None,
        wheels: Sequence[contracts.Wheel] = (),
    ) -> None:
        self.pip = [pip] if isinstance(pip, str) else list(pip or [])
        self.index_url = index_url
        self.extra_index_urls = list(extra_index_urls)
        self.find_links = list(find_links)
        if requirements is not None:
            self._read(Path(requirements))
        self.local_packages = [Path(p) for p in local_packages]
        self.isolated = isolated
        self.python = python
        self.wheels = list(wheels)  # already uploaded (a re-run's)
        self._uploaded: dict[int, list[contracts.Wheel]] = {}
        self.spec()  # a malformed requirement fails here, naming the field

    def __repr__(self) -> str:
        parts = [repr(self.pip)] + [f"isolated={self.isolated}"] * self.isolated
        return f"gl.Env({', '.join(parts)})"

    def merged(self, pip: Iterable[str] = (), requirements: Any = None) -> "Env":
        """A copy with more requirements (``pip=``/``requirements=`` given beside it)."""
        out = Env.__new__(Env)
        out.__dict__.update({k: list(v) if isinstance(v, list) else v
                             for k, v in self.__dict__.items()})  # fmt: skip
        out.pip += list(pip)
        if requirements is not None:
            out._read(Path(requirements))
        out._uploaded = self._uploaded
        out.spec()
        return out

    def spec(self, conn: Uploads | None = None) -> contracts.EnvSpec:
        """The wire form; local packages are built and uploaded through ``conn``
        (once per connection).

        Raises
        ------
        ValidationError
            Naming the field (``environment.pip.0``) of a malformed requirement.
        """
        wheels = list(self.wheels)
        if self.local_packages and conn is not None:
            if id(conn) not in self._uploaded:
                self._uploaded[id(conn)] = [_upload(conn, p) for p in self.local_packages]
            wheels += self._uploaded[id(conn)]
        try:
            return contracts.EnvSpec(
                pip=self.pip,
                index_url=self.index_url,
                extra_index_urls=self.extra_index_urls,
                find_links=self.find_links,
                isolated=self.isolated,
                python=self.python,
                wheels=wheels,
            )
        except pydantic.ValidationError as e:
            first = e.errors()[0]
            field = ".".join(["environment", *(str(p) for p in first["loc"])])
            msg = first["msg"].removeprefix("Value error, ")
            raise errors.ValidationError(f"{field}: {msg}", field=field) from None

    @property
    def needs_upload(self) -> bool:
        """Whether :meth:`spec` must be given a connection (local packages)."""
        return bool(self.local_packages)

    @classmethod
    def from_job(cls, job: Any) -> "Env":
        """The env a finished job ran with, pinned to the exact versions it had (its
        own packages and those the worker provided), for a re-run.

        ``job`` is a :class:`gpulayer.Job` or the :class:`~gpulayer.contracts.Job`
        read with ``conn.job(id)``.

        Raises
        ------
        ValidationError
            If the job had no environment, or its env was never built.
        """
        info = job if isinstance(job, contracts.Job) else job.refresh().info
        spec: contracts.EnvSpec | None = info.spec.environment
        built: contracts.TaskEnvironment | None = info.environment
        if spec is None or built is None or built.phase != "ready":
            raise errors.ValidationError(
                f"job {info.id} has no built environment to pin", field="environment"
            )
        shipped = {w.filename.split("-")[0].replace("_", "-").lower() for w in spec.wheels}
        pins = [
            p for p in [*built.packages, *built.from_worker]
            if p.split("==")[0].split(" @ ")[0].strip().lower() not in shipped
        ]  # fmt: skip
        return cls(
            pins,
            index_url=spec.index_url,
            extra_index_urls=spec.extra_index_urls,
            find_links=spec.find_links,
            isolated=spec.isolated,
            python=spec.python,
            wheels=spec.wheels,
        )

    # -------------------------------------------------------------- reading

    def _read(self, path: Path, depth: int = 0) -> None:
        """Add a requirements file's lines (``-r`` files too, up to 8 deep)."""
        try:
            text = path.read_text()
        except OSError as e:
            raise errors.ValidationError(
                f"requirements: cannot read {path}: {e.strerror or e}", field="requirements"
            ) from None
        words: list[str]
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            where = f"requirements: {path}:{number}"
            if not line.startswith("-"):
                self.pip.append(line)
                continue
            words = line.replace("=", " ", 1).split(None, 1)
            option, value = words[0], (words[1].strip() if len(words) > 1 else "")
            if option in ("-r", "--requirement") and value and depth < 8:
                self._read(path.parent / value, depth + 1)
            elif option in _FILE_OPTIONS and value:
                field = _FILE_OPTIONS[option]
                if field == "index_url":
                    self.index_url = value
                else:
                    getattr(self, field).append(value)
            else:
                raise errors.ValidationError(
                    f"{where}: {line!r} is not supported here (requirements, -r,"
                    " --index-url, --extra-index-url and --find-links are; ship local"
                    " code with local_packages)",
                    field="requirements",
                )


def _upload(conn: Uploads, path: Path) -> contracts.Wheel:
    """Upload one local package as a wheel (a project folder is built into one)."""
    if path.is_dir():
        with tempfile.TemporaryDirectory(prefix="gl-wheel-") as out:
            return _upload(conn, _build_wheel(path, Path(out)))
    if path.suffix != ".whl" or not path.is_file():
        return _missing(path)
    ref = conn.upload_blob(path.read_bytes())
    return contracts.Wheel(filename=path.name, sha256=ref.sha256)


def _missing(path: Path) -> contracts.Wheel:
    raise errors.ValidationError(
        f"local_packages: {path} is neither a .whl file nor a project folder",
        field="local_packages",
    )


def _build_wheel(project: Path, out: Path) -> Path:
    """Build ``project`` into a wheel in ``out`` (uv when installed, else pip)."""
    try:
        import uv

        argv = [uv.find_uv_bin(), "build", "--wheel", "--out-dir", str(out), str(project)]
    except (ImportError, FileNotFoundError):
        argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(project)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wheels = sorted(out.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise errors.ValidationError(
            f"local_packages: cannot build {project} into a wheel: {tail}",
            field="local_packages",
        )
    return wheels[0]
