"""Job environments on a worker: built with uv, cached, shared, evicted.

A job's :class:`~gpulayer.contracts.EnvSpec` becomes a virtual env in the
worker's env cache (``--env-cache``), in a folder named by its *key*: a hash of
the normalized spec, the interpreter, the installer and, for a layered env, the
worker's own packages (docs/environments.md, ADR 0105)::

    <cache>/<key>/                  the env (ready once .gpulayer-env.json is there)
    <cache>/<key>.build             flock: held (exclusive) while someone builds it
    <cache>/<key>.use               flock: shared while a task or runner uses it
    <cache>/.uv                     uv's download cache

**Layered** (the default): the env's own packages come first; a ``.pth`` file
adds the worker's site-packages behind them, so the worker's torch stays
importable. uv resolves the requirements against the worker's interpreter first
(``--dry-run``), so what the worker already has is not installed again; only the
rest goes into the env (``--no-deps``, exact pins). **Isolated**: a clean env;
only gpulayer and cloudpickle (which the function runner needs) are reachable,
behind the env's own packages.

**Who builds, who uses**: the worker builds (its user; root in ``gpulayer up``),
tasks only read. Under a root worker whose tasks run as ``gpulayer-task``, only
wheels are installed (``--only-binary :all:``): installing a wheel runs none of
its code, building an sdist would run it as root. Envs are 0755/0644 and belong
to the worker, so no task changes an env another owner's task will use.

Two tasks asking for one env build it once (the ``.build`` lock, a file lock, so
two agents on one machine agree too); the cache keeps at most ``max_bytes``,
evicting the least recently used envs no task uses (the ``.use`` lock).

uv does not read pip's configuration: :func:`pip_index_options` reads it
(``pip.conf`` files and ``PIP_*`` variables) and passes the index, extra indexes
and find-links on as uv's flags; a job's ``index_url`` replaces the worker's
index, its extra indexes and find-links add to the worker's.
"""

import asyncio
import configparser
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import site
import stat
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from gpulayer import contracts as c
from gpulayer.errors import ConfigError, GpulayerError

log = logging.getLogger(__name__)

#: In a task's environment: the interpreter of its env (runners, kernels, ranks use it).
ENV_PYTHON = "GPULAYER_PYTHON"
MARKER = ".gpulayer-env.json"
#: Default size cap of the env cache.
DEFAULT_MAX_BYTES = 20 * 1024**3
_BASE_PTH = "_gpulayer_base.pth"
_RUNTIME_PTH = "_gpulayer_runtime.pth"
_RUNTIME_MODULES = ("gpulayer", "cloudpickle")  # what a function runner imports
_ERROR_LINES = 40
#: A line of uv's plan: `` + name==1.0``, `` + name @ file:///x.whl`` or
#: `` + name==1.0 (from file:///x.whl)``.
_PIN = re.compile(
    r"^\s*\+\s+([A-Za-z0-9][A-Za-z0-9._-]*)(?:==(\S+))?(?:\s+@\s+(\S+))?"
    r"(?:\s+\(from\s+(\S+)\))?"
)

#: ``on_line(text)``: one line of the build's output, for the task's log.
BuildLine = Callable[[str], None]
#: ``fetch(sha256)``: a blob of the job (a shipped wheel).
Fetch = Callable[[str], Awaitable[bytes]]


class EnvBuildFailed(GpulayerError):
    """The installer refused the env; the message is its own (naming the requirement)."""


@dataclasses.dataclass(frozen=True)
class EnvRef:
    """A ready env, as a run applies it to a process's environment."""

    key: str
    path: str
    isolated: bool

    @property
    def python(self) -> str:
        return f"{self.path}/bin/python"

    def apply(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with this env active: its ``bin`` first on ``PATH``, ``VIRTUAL_ENV``,
        :data:`ENV_PYTHON`; an isolated env also drops ``PYTHONPATH``."""
        out = dict(env)
        out["VIRTUAL_ENV"] = self.path
        out["PATH"] = f"{self.path}/bin" + (f":{out['PATH']}" if out.get("PATH") else "")
        out[ENV_PYTHON] = self.python
        out.pop("PYTHONHOME", None)
        if self.isolated:
            out.pop("PYTHONPATH", None)
        return out


def interpreter(env: Mapping[str, str]) -> str:
    """The Python a process with environment ``env`` runs user code in."""
    return env.get(ENV_PYTHON) or sys.executable


@dataclasses.dataclass
class Prepared:
    """A task's env, ready: what to apply, what to report, and the hold on it."""

    ref: EnvRef
    report: c.TaskEnvironment
    hold: "EnvHold"


class EnvHold:
    """A shared lock on an env's ``.use`` file: the env is not evicted while held."""

    def __init__(self, cache: "EnvCache", key: str, fd: int) -> None:
        self._cache = cache
        self.key = key
        self._fd: int | None = fd
        cache._in_use[key] = cache._in_use.get(key, 0) + 1

    def release(self) -> None:
        """Let the env go (idempotent)."""
        if self._fd is None:
            return
        os.close(self._fd)
        self._fd = None
        left = self._cache._in_use.get(self.key, 1) - 1
        if left:
            self._cache._in_use[self.key] = left
        else:
            self._cache._in_use.pop(self.key, None)


# ---------------------------------------------------------------- pip's config


def pip_index_options(environ: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """``index_url``, ``extra_index_urls``, ``find_links`` and ``no_index`` from pip's
    configuration files and ``PIP_*`` variables (later ones win, as in pip)."""
    environ = os.environ if environ is None else environ
    files = [Path("/etc/pip.conf"), Path("/etc/xdg/pip/pip.conf")]
    home = Path(environ.get("HOME", "~")).expanduser()
    files += [home / ".pip/pip.conf", home / ".config/pip/pip.conf"]
    if sys.prefix != sys.base_prefix:
        files.append(Path(sys.prefix, "pip.conf"))
    if environ.get("PIP_CONFIG_FILE"):
        files.append(Path(environ["PIP_CONFIG_FILE"]))
    values: dict[str, str] = {}
    for path in files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError, UnicodeDecodeError) as e:
            log.warning("cannot read pip configuration %s: %s", path, e)
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                values.update(parser.items(section))
    for key in ("index-url", "extra-index-url", "find-links", "no-index"):
        env_key = "PIP_" + key.upper().replace("-", "_")
        if env_key in environ:
            values[key] = environ[env_key]
    out: dict[str, list[str]] = {
        "index_url": values["index-url"].split()[:1] if values.get("index-url") else [],
        "extra_index_urls": values.get("extra-index-url", "").split(),
        "find_links": values.get("find-links", "").split(),
        "no_index": ["1"]
        if values.get("no-index", "").lower() in ("1", "true", "yes", "on")
        else [],
    }
    return out


def index_args(
    spec: c.EnvSpec, pip_config: Mapping[str, list[str]], wheel_dir: Path | None
) -> list[str]:
    """The installer's index flags: the job's index replaces the worker's, the job's
    extra indexes and find-links add to the worker's."""
    args: list[str] = []
    index = [spec.index_url] if spec.index_url else pip_config.get("index_url", [])
    for url in index:
        args += ["--index-url", url]
    for url in [*pip_config.get("extra_index_urls", []), *spec.extra_index_urls]:
        args += ["--extra-index-url", url]
    links = [*pip_config.get("find_links", []), *spec.find_links]
    if wheel_dir is not None:
        links.append(str(wheel_dir))
    for link in links:
        args += ["--find-links", link]
    if pip_config.get("no_index") and not spec.index_url:
        args.append("--no-index")
    return args


# ------------------------------------------------------------------- the cache


class EnvCache:
    """The worker's envs: :meth:`prepare` builds or reuses one, :meth:`listing`
    reports them, eviction keeps the cache under ``max_bytes``.

    Parameters
    ----------
    root
        The cache folder (made 0755, and refused when another user owns it or
        others may write it).
    max_bytes
        Size cap; least recently used envs that nothing uses go first.
    wheels_only
        Install wheels only (a root worker whose tasks run as another user).
    installer
        ``"uv"`` (default when found), or ``"pip"``.
    """

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        wheels_only: bool = False,
        installer: str | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.root = Path(root).absolute()
        self.max_bytes = max_bytes
        self.wheels_only = wheels_only
        self._uv = _find_uv() if installer in (None, "uv") else None
        if installer == "uv" and self._uv is None:
            raise ConfigError("the env installer 'uv' was asked for but is not installed")
        self.installer = "uv" if self._uv else "pip"
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._pip_config = pip_index_options(self._base_env)
        self._in_use: dict[str, int] = {}
        self._base: tuple[str, ...] | None = None
        self._base_digest: str | None = None
        self._made = False
        self._keys: dict[str, str] = {}  # spec digest -> key (the worker does not change)

    # -------------------------------------------------------------- entry

    async def prepare(
        self,
        spec: c.EnvSpec,
        on_line: BuildLine,
        report: Callable[[c.TaskEnvironment], Awaitable[None]],
        fetch: Fetch | None = None,
    ) -> Prepared:
        """The env of ``spec``, built unless cached, held until :meth:`EnvHold.release`.

        ``report`` hears ``preparing`` (only when it is not a cache hit) and then
        ``ready``/``failed``; ``on_line`` gets the installer's output; ``fetch`` gets
        the wheels shipped with the job (blobs) when it is built.

        Raises
        ------
        EnvBuildFailed
            With the installer's own message.
        """
        started = datetime.now(UTC)
        digest = spec.digest
        key = self._keys.get(digest)
        if key is None:  # the first time: reads the worker's distributions
            key = self._keys[digest] = await asyncio.to_thread(self.key, spec)
        # A hit is a few small file operations: inline, unless an eviction holds the lock.
        try:
            hit = self._hold_ready(key, wait=False)
        except BlockingIOError:
            hit = await asyncio.to_thread(self._hold_ready, key)
        cached = hit is not None
        try:
            if hit is None:
                await report(c.TaskEnvironment(phase="preparing", key=key, started_at=started))
                hit = await self._build_or_wait(key, spec, on_line, fetch)
        except EnvBuildFailed as e:
            await report(
                c.TaskEnvironment(
                    phase="failed",
                    key=key,
                    started_at=started,
                    ended_at=datetime.now(UTC),
                    error=str(e)[:8192],
                )
            )
            raise
        hold, info = hit
        ref = EnvRef(key, str(self.root / key), spec.isolated)
        done = c.TaskEnvironment(
            phase="ready",
            key=key,
            cached=cached,
            python=info.get("python", ""),
            packages=info.get("packages", []),
            from_worker=info.get("from_worker", []),
            started_at=started,
            ended_at=datetime.now(UTC),
        )
        await report(done)
        return Prepared(ref, done, hold)

    def key(self, spec: c.EnvSpec) -> str:
        """The cache key of ``spec`` on this worker (blocking the first time: it reads
        the worker's installed distributions)."""
        parts = [
            spec.digest,
            self.installer,
            "wheels-only" if self.wheels_only else "any",
            spec.python or sys.version.split()[0],
            sys.executable,
            "" if spec.isolated else self._worker_digest(),
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]

    def hold(self, key: str) -> EnvHold | None:
        """Another hold on a ready env (a runner that uses it), or None if it is gone."""
        got = self._hold_ready(key)
        return None if got is None else got[0]

    def listing(self) -> list[c.CachedEnv]:
        """The envs in the cache, most recently used first (at most 32)."""
        out = []
        for key, info, used in self._ready_envs():
            out.append(
                c.CachedEnv(
                    key=key,
                    size_bytes=int(info.get("size_bytes", 0)),
                    last_used_at=datetime.fromtimestamp(used, UTC),
                    in_use=self._in_use.get(key, 0),
                    packages=len(info.get("packages", [])),
                    python=str(info.get("python", "")),
                )
            )
        out.sort(key=lambda e: e.last_used_at, reverse=True)
        return out[: c.environments.MAX_REPORTED_ENVS]

    # ------------------------------------------------------------ folders

    def _make_root(self) -> None:
        if self._made:
            return
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        st = self.root.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise ConfigError(
                f"the env cache {self.root} is not this user's own folder (or others may"
                " write it): pick another with --env-cache"
            )
        self.root.chmod(0o755)  # tasks (another user) read envs, never write them
        self._made = True

    def _lock(self, key: str, kind: str) -> int:
        self._make_root()
        return os.open(self.root / f"{key}.{kind}", os.O_RDWR | os.O_CREAT, 0o644)

    def _info(self, key: str) -> dict | None:  # type: ignore[type-arg]
        try:
            return dict(json.loads((self.root / key / MARKER).read_text()))
        except (OSError, ValueError):
            return None

    def _hold_ready(self, key: str, wait: bool = True) -> "tuple[EnvHold, dict] | None":  # type: ignore[type-arg]
        """A hold on ``key`` if it is built (blocking: waits out an eviction; without
        ``wait``, raises BlockingIOError when it would have to)."""
        if self._info(key) is None:
            return None
        fd = self._lock(key, "use")
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            raise
        info = self._info(key)  # evicted while we waited for the lock?
        if info is None:
            os.close(fd)
            return None
        with contextlib.suppress(OSError):
            os.utime(self.root / key / MARKER)  # last used, for eviction
        return EnvHold(self, key, fd), info

    async def _build_or_wait(
        self, key: str, spec: c.EnvSpec, on_line: BuildLine, fetch: Fetch | None
    ) -> "tuple[EnvHold, dict]":  # type: ignore[type-arg]
        fd = await asyncio.to_thread(self._lock, key, "build")
        try:
            if not await asyncio.to_thread(_try_lock, fd):
                on_line("environment: another task is building it; waiting")
                await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
            hit = await asyncio.to_thread(self._hold_ready, key)
            if hit is not None:
                on_line(f"environment {key[:12]} ready (built by another task)")
                return hit
            await self._build(key, spec, on_line, fetch)
            hit = await asyncio.to_thread(self._hold_ready, key)
            if hit is None:  # pragma: no cover - evicted the moment it was built
                raise EnvBuildFailed("the environment was evicted as soon as it was built")
        finally:
            os.close(fd)
        await asyncio.to_thread(self._evict, keep=key)
        return hit

    # -------------------------------------------------------------- build

    async def _build(
        self, key: str, spec: c.EnvSpec, on_line: BuildLine, fetch: Fetch | None
    ) -> None:
        """Build ``spec`` into ``<root>/<key>`` (under its ``.build`` lock)."""
        target = self.root / key
        began = time.monotonic()
        await asyncio.to_thread(shutil.rmtree, target, True)  # a failed build's remains
        reqs = list(spec.pip)
        wheel_dir = target / ".wheels" if spec.wheels else None
        on_line(
            f"environment {key[:12]}: building with {self.installer}"
            f" ({'isolated' if spec.isolated else 'layered on the worker'}):"
            f" {' '.join(reqs + [w.filename for w in spec.wheels]) or 'no packages'}"
        )
        try:
            await self._venv(target, spec, on_line)
            python = str(target / "bin/python")
            version = (await self._run([python, "-c", _VERSION], None, quiet=True)).strip()
            if spec.python and version != spec.python:
                raise EnvBuildFailed(f"python {spec.python} asked for, the worker found {version}")
            if wheel_dir is not None:
                if fetch is None:
                    raise EnvBuildFailed("this worker cannot fetch the job's wheels")
                for wheel in spec.wheels:
                    data = await fetch(wheel.sha256)
                    await asyncio.to_thread(_write_file, wheel_dir / wheel.filename, data)
                reqs += [str(wheel_dir / w.filename) for w in spec.wheels]
            await asyncio.to_thread(self._link_base, target, spec, version)
            from_worker = await self._install(python, spec, reqs, wheel_dir, on_line)
            packages = await self._freeze(python)
            size = await asyncio.to_thread(_tree_bytes, target)
            info = {
                "key": key, "python": version, "packages": packages, "from_worker": from_worker,
                "size_bytes": size, "isolated": spec.isolated, "installer": self.installer,
                "built_at": time.time(),
            }  # fmt: skip
            await asyncio.to_thread(_write_marker, target, info)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, target, True)
            raise
        on_line(
            f"environment {key[:12]} built in {time.monotonic() - began:.1f}s:"
            f" {len(packages)} package(s) of its own"
            + (f", {len(from_worker)} from the worker" if from_worker else "")
        )

    async def _venv(self, target: Path, spec: c.EnvSpec, on_line: BuildLine) -> None:
        python = spec.python or sys.executable
        if self._uv is not None:
            await self._run([self._uv, "venv", "--quiet", "--python", python, str(target)], on_line)
        else:
            if spec.python:
                found = shutil.which(f"python{spec.python}")
                if found is None:
                    raise EnvBuildFailed(f"no python{spec.python} on this worker's PATH")
                python = found
            await self._run([python, "-m", "venv", "--without-pip", str(target)], on_line)

    def _link_base(self, target: Path, spec: c.EnvSpec, version: str) -> None:
        """Layered: a ``.pth`` that adds the worker's site-packages behind the env's own.
        Isolated: only gpulayer and cloudpickle, for the function runner."""
        site_dir = _site_packages(target, version)
        mine = f"{sys.version_info.major}.{sys.version_info.minor}"
        if not spec.isolated and version != mine:
            raise EnvBuildFailed(
                f"a layered env runs the worker's Python {mine}, not {version}: ask for"
                f" Python {version} with isolated=True"
            )
        if not spec.isolated:
            dirs = self._worker_site_dirs()
            line = f"import site; list(map(site.addsitedir, {dirs!r}))\n"
            (site_dir / _BASE_PTH).write_text(line)
            return
        shim = target / ".gpulayer-runtime"
        shim.mkdir(mode=0o755)
        for name in _RUNTIME_MODULES:
            module = sys.modules.get(name) or __import__(name)
            (shim / name).symlink_to(Path(module.__file__ or "").parent)
        (site_dir / _RUNTIME_PTH).write_text(f"{shim}\n")

    async def _install(
        self, python: str, spec: c.EnvSpec, reqs: list[str], wheel_dir: Path | None,
        on_line: BuildLine,
    ) -> list[str]:  # fmt: skip
        """Install ``reqs``; answers the requirements the worker's packages satisfied."""
        if not reqs:
            return []
        index = index_args(spec, self._pip_config, wheel_dir)
        binary = ["--only-binary", ":all:"] if self.wheels_only else []
        if self._uv is None:
            await self._run(
                [sys.executable, "-m", "pip", "--python", python, "install", "--no-input",
                 *binary, *index, *reqs], on_line,
            )  # fmt: skip
            return []
        if spec.isolated:
            await self._run(
                [self._uv, "pip", "install", "--python", python, *binary, *index, *reqs], on_line
            )
            return []
        # Layered: resolve against the worker's own packages; install only the rest.
        plan = await self._run(
            [self._uv, "pip", "install", "--dry-run", "--python", sys.executable,
             "--break-system-packages", *binary, *index, *reqs], on_line,
        )  # fmt: skip
        pins, named = [], set()
        for line in plan.splitlines():
            m = _PIN.match(line)
            if m and (m.group(2) or m.group(3) or m.group(4)):
                name, version, url, source = m.groups()
                named.add(_canonical(name))
                where = url or source
                pins.append(f"{name} @ {where}" if where else f"{name}=={version}")
        if pins:
            await self._run(
                [
                    self._uv,
                    "pip",
                    "install",
                    "--python",
                    python,
                    "--no-deps",
                    *binary,
                    *index,
                    *pins,
                ],
                on_line,
            )
        have = self._worker_versions()
        out = []
        for req in spec.pip:
            name = _canonical(re.split(r"[\s\[<>=!~;@(]", req, maxsplit=1)[0])
            if name not in named and name in have:
                out.append(f"{name}=={have[name]}")
        return out

    async def _freeze(self, python: str) -> list[str]:
        if self._uv is not None:
            text = await self._run(
                [self._uv, "pip", "freeze", "--python", python], None, quiet=True
            )
        else:
            site_dir = await self._run([python, "-c", _PURELIB], None, quiet=True)
            text = await self._run(
                [sys.executable, "-m", "pip", "freeze", "--path", site_dir.strip()],
                None,
                quiet=True,
            )
        return sorted(line.strip() for line in text.splitlines() if line.strip())

    async def _run(self, argv: list[str], on_line: BuildLine | None, *, quiet: bool = False) -> str:
        """Run one installer step; its output goes to ``on_line`` line by line and is
        answered whole. A failure raises :class:`EnvBuildFailed` with its message."""
        env = dict(self._base_env)
        env.update(
            UV_CACHE_DIR=str(self.root / ".uv"), UV_PYTHON_DOWNLOADS="never", NO_COLOR="1",
            UV_NO_PROGRESS="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
        )  # fmt: skip
        env.pop("VIRTUAL_ENV", None)
        if cert := env.get("PIP_CERT"):
            env.setdefault("SSL_CERT_FILE", cert)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            # quiet: stdout is the answer (a freeze), the messages only matter on failure
            stderr=asyncio.subprocess.PIPE if quiet else asyncio.subprocess.STDOUT,
            env=env,
            umask=0o022,  # tasks (another user) read the env
            start_new_session=True,
        )
        assert proc.stdout is not None
        lines: list[str] = []
        try:
            if quiet:
                out, err = await proc.communicate()
                lines = err.decode(errors="replace").splitlines()
            else:
                while raw := await proc.stdout.readline():
                    text = raw.decode(errors="replace").rstrip()
                    lines.append(text)
                    if on_line is not None and text:
                        on_line(text)
            code = await proc.wait()
        except BaseException:  # cancelled (the task was): leave no installer behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
            raise
        if code != 0:
            raise EnvBuildFailed(_installer_message(lines) or f"{argv[0]} exited with {code}")
        return out.decode(errors="replace") if quiet else "\n".join(lines)

    # --------------------------------------------------------- the worker

    def _worker_site_dirs(self) -> list[str]:
        if self._base is None:
            dirs = [*site.getsitepackages(), *sys.path]
            if site.ENABLE_USER_SITE:
                dirs.append(site.getusersitepackages())
            keep = [
                d for d in dirs
                if d and ("site-packages" in d or "dist-packages" in d) and os.path.isdir(d)
            ]  # fmt: skip
            self._base = tuple(dict.fromkeys(keep))
        return list(self._base)

    def _worker_versions(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for dist in metadata.distributions():
            name = dist.metadata["Name"]
            if name:
                out.setdefault(_canonical(name), dist.version)
        return out

    def _worker_digest(self) -> str:
        """What a layered env sits on: the worker's site dirs and distributions."""
        if self._base_digest is None:
            listed = sorted(f"{k}=={v}" for k, v in self._worker_versions().items())
            text = "\n".join([*self._worker_site_dirs(), *listed])
            self._base_digest = hashlib.sha256(text.encode()).hexdigest()
        return self._base_digest

    # ------------------------------------------------------------ eviction

    def _ready_envs(self) -> list[tuple[str, dict, float]]:  # type: ignore[type-arg]
        if not self.root.is_dir():
            return []
        out = []
        for entry in self.root.iterdir():
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            try:
                used = (entry / MARKER).stat().st_mtime
            except OSError:
                continue
            info = self._info(entry.name)
            if info is not None:
                out.append((entry.name, info, used))
        return out

    def _evict(self, keep: str) -> list[str]:
        """Remove least recently used envs nothing holds until the cache fits
        ``max_bytes`` (blocking). Answers the keys removed."""
        envs = sorted(self._ready_envs(), key=lambda e: e[2])
        total = sum(int(info.get("size_bytes", 0)) for _, info, _ in envs)
        gone: list[str] = []
        for key, info, _ in envs:
            if total <= self.max_bytes:
                break
            if key == keep:
                continue
            fd = self._lock(key, "use")
            try:
                if not _try_lock(fd):
                    continue  # a task or runner uses it
                with contextlib.suppress(FileNotFoundError):
                    (self.root / key / MARKER).unlink()
                trash = self.root / f".evicted-{key}-{os.getpid()}"
                with contextlib.suppress(FileNotFoundError):
                    (self.root / key).rename(trash)
                    shutil.rmtree(trash, ignore_errors=True)
            finally:
                os.close(fd)
            total -= int(info.get("size_bytes", 0))
            gone.append(key)
            log.info("env cache: evicted %s (%d bytes)", key, info.get("size_bytes", 0))
        return gone


_TRUE = ("1", "true", "yes", "on")
_VERSION = "import sys; print('%d.%d' % sys.version_info[:2])"
_PURELIB = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


def default_root() -> Path:
    """``$GPULAYER_ENV_CACHE``, else ``<temp dir>/gpulayer-envs-<uid>``: outside the
    worker's 0700 data dir, so its task user can reach the envs."""
    if env := os.environ.get("GPULAYER_ENV_CACHE"):
        return Path(env)
    return Path(tempfile.gettempdir(), f"gpulayer-envs-{os.geteuid()}")


def _find_uv() -> str | None:
    with contextlib.suppress(ImportError, FileNotFoundError):
        import uv

        return str(uv.find_uv_bin())
    return shutil.which("uv")


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise
    return True


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _site_packages(target: Path, version: str) -> Path:
    return target / "lib" / f"python{version}" / "site-packages"


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _write_marker(target: Path, info: dict) -> None:  # type: ignore[type-arg]
    tmp = target / f"{MARKER}.part"
    tmp.write_text(json.dumps(info))
    tmp.chmod(0o644)
    os.replace(tmp, target / MARKER)


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o644)


def _installer_message(lines: list[str]) -> str:
    """The installer's own error: from its first ``error``/``×`` line on, else the tail."""
    start = next(
        (i for i, t in enumerate(lines) if t.lstrip().startswith(("error", "ERROR", "×"))), None
    )
    tail = lines[start:] if start is not None else lines[-10:]
    text = " ".join(t.strip(" ╰─▶│") for t in tail[:_ERROR_LINES] if t.strip())
    return re.sub(r"\s+", " ", text).strip()
