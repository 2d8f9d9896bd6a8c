"""Tools Debian does not package, built into a guest image root from their source.

A recipe's ``source_tools`` entry is either ``{name, source, build}`` (a tarball or directory,
path relative to the recipe folder or an http(s) URL; ``build`` autotools or make) or
``{name, binary}`` (a prebuilt static binary). Sources are built inside the image root with
the distribution's own compiler and ``-dev`` packages, which are installed for the build and
purged afterwards; the result goes to /usr/local/bin. What a source is (its bytes) is part
of the image cache key, so a new tarball builds a new image.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import shlex
import shutil
import tarfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import CommandError, ConfigError, TestbedError
from testbed.host import paths, proc

log = logging.getLogger(__name__)

BUILDS = ("autotools", "make")
_BASE_PACKAGES = ("build-essential",)
_AUTORECONF_PACKAGES = ("autoconf", "automake", "libtool", "pkg-config")
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_.")


@dataclass(frozen=True)
class SourceTool:
    name: str
    source: str | None = None          # as written in the recipe
    build: str | None = None
    binary: str | None = None
    packages: tuple[str, ...] = ()     # extra -dev packages the build needs
    version_args: tuple[str, ...] = ("-V",)
    resolved: Path | None = None       # the local file or folder (a URL is fetched to the cache)


#: a Debian package name (Debian policy 5.6.1), optionally with :arch
PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]{1,99}(:[a-z0-9-]{1,20})?")


class BuildError(TestbedError):
    """A source tool did not build: names the tool and step, with the compiler's last lines."""


def parse(file: str, folder: Path, raw: object, *, fetch: bool = True) -> tuple[SourceTool, ...]:
    """Validate the ``source_tools`` field; bad input is a ConfigError naming the entry."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(file, "source_tools", "must be a list of {name, source, build} or {name, binary}")
    out = []
    for i, entry in enumerate(raw):
        where = f"source_tools[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(file, where, "must be a mapping")
        unknown = set(entry) - {"name", "source", "build", "binary", "packages", "version_args"}
        if unknown:
            raise ConfigError(file, f"{where}.{sorted(unknown)[0]}", "unknown field")
        name = entry.get("name")
        if not isinstance(name, str) or not name or not set(name) <= _NAME_CHARS:
            raise ConfigError(file, f"{where}.name", f"{name!r} is not a plain lower-case program name")
        if ("source" in entry) == ("binary" in entry):
            raise ConfigError(file, where, "give exactly one of source (with build) or binary")
        packages = entry.get("packages", [])
        if not isinstance(packages, list) or not all(isinstance(p, str) and PACKAGE.fullmatch(p)
                                                     for p in packages):
            raise ConfigError(file, f"{where}.packages", "must be a list of Debian package names")
        vargs = entry.get("version_args", ["-V"])
        if not isinstance(vargs, list) or len(vargs) > 8 or not all(
                isinstance(a, str) and a.isprintable() and len(a) <= 64 for a in vargs):
            raise ConfigError(file, f"{where}.version_args", "must be a list of arguments")
        if "binary" in entry:
            path = _local(file, f"{where}.binary", folder, entry["binary"])
            if not path.is_file():
                raise ConfigError(file, f"{where}.binary", f"{path} is not a file")
            out.append(SourceTool(name, binary=str(entry["binary"]), version_args=tuple(vargs),
                                  resolved=path))
            continue
        build = entry.get("build")
        if build not in BUILDS:
            raise ConfigError(file, f"{where}.build", f"{build!r}: one of {', '.join(BUILDS)}")
        src = entry["source"]
        if isinstance(src, str) and src.startswith(("http://", "https://")):
            path = _fetch(file, f"{where}.source", src) if fetch else None
        else:
            path = _local(file, f"{where}.source", folder, src)
            if not (path.is_dir() or (path.is_file() and tarfile.is_tarfile(path))):
                raise ConfigError(file, f"{where}.source", f"{path} is neither a folder nor a tarball")
        out.append(SourceTool(name, source=src, build=build, packages=tuple(packages),
                              version_args=tuple(vargs), resolved=path))
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ConfigError(file, "source_tools", "a tool name appears twice")
    return tuple(out)


def _local(file: str, field: str, folder: Path, value: object) -> Path:
    """A path the recipe names: relative to its folder, and inside it once resolved (symbolic
    links included), so a recipe cannot feed the build a file from elsewhere on the host."""
    if not isinstance(value, str) or not value or "\0" in value:
        raise ConfigError(file, field, "must be a path")
    try:
        path = (folder / value).resolve()
        inside = path.is_relative_to(folder.resolve())
    except (OSError, RuntimeError, ValueError) as e:
        raise ConfigError(file, field, f"{value!r}: cannot be resolved ({e})") from None
    if not inside:
        raise ConfigError(file, field, f"{value!r} resolves to {path}, outside the recipe folder "
                                       f"{folder}; put the source inside it")
    if not path.exists():
        raise ConfigError(file, field, f"{path} does not exist")
    return path


def _fetch(file: str, field: str, url: str) -> Path:
    """A URL is fetched once into the cache, under the hash of the URL."""
    dest = paths.cache_dir() / "sources" / hashlib.sha256(url.encode()).hexdigest()[:16] / Path(url).name
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as f:   # noqa: S310
            shutil.copyfileobj(r, f)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ConfigError(file, field, f"cannot fetch {url}: {e}") from None
    if not tarfile.is_tarfile(tmp):
        tmp.unlink()
        raise ConfigError(file, field, f"{url} is not a tarball")
    tmp.rename(dest)
    return dest


def digest(tool: SourceTool) -> str:
    """What the tool is: its name, how it is built, and every byte of its source."""
    h = hashlib.sha256(repr((tool.name, tool.build, tool.packages, tool.version_args)).encode())
    path = tool.resolved
    if path is None:
        h.update(str(tool.source).encode())
    elif path.is_file():
        h.update(path.read_bytes())
    else:
        for p in sorted(path.rglob("*")):
            if p.is_file() and ".git" not in p.relative_to(path).parts:
                h.update(str(p.relative_to(path)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def _chroot(root: Path, script: str, step: str, subject: str, timeout: float = 1800) -> str:
    """``subject``: what the step is for, as its error names it ("source tool uperf")."""
    # stderr into stdout: a compiler's error and the make line around it stay in order
    try:
        return proc.run(["chroot", str(root), "/bin/sh", "-ec", "exec 2>&1\n" + script],
                        timeout=timeout).stdout
    except CommandError as e:
        what = "timed out" if e.timed_out else f"exited {e.rc}"
        tail = "\n".join((e.stdout or e.stderr_tail).strip().splitlines()[-15:])
        raise BuildError(f"{subject}: {step} {what}; last lines:\n{tail}") from None


@contextlib.contextmanager
def _apt_root(root: Path) -> Iterator[None]:
    """An unpacked image root that apt can install into: the host's resolver and the device
    nodes apt opens, for the duration; the root's own resolv.conf, no package lists and no
    added nodes after (at boot devtmpfs covers /dev)."""
    resolv = root / "etc/resolv.conf"
    saved = resolv.read_bytes() if resolv.is_file() and not resolv.is_symlink() else None
    made = _device_nodes(root)
    try:
        if resolv.is_symlink():
            resolv.unlink()
        shutil.copy2("/etc/resolv.conf", resolv)
        yield
    finally:
        shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
        (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
        if saved is not None:
            resolv.write_bytes(saved)
        for node in made:
            node.unlink(missing_ok=True)


def _apt_install(root: Path, packages: set[str] | tuple[str, ...], step: str, subject: str) -> None:
    _chroot(root, "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
            "--no-install-recommends " + " ".join(sorted(packages)) + " && apt-get clean",
            step, subject)


def add_packages(root: Path, packages: tuple[str, ...]) -> None:
    """Install a derived recipe's own Debian packages into its base's unpacked root; they
    stay in the image (a tracer, a debugging tool), unlike a source tool's build packages."""
    if not packages:
        return
    log.info("installing packages %s", " ".join(packages))
    with _apt_root(root):
        _apt_install(root, packages, "installing packages", "the recipe's packages")


def install(root: Path, tools: tuple[SourceTool, ...]) -> None:
    """Build (or copy) every tool into ``root``; build-only packages are purged after."""
    if not tools:
        return
    for t in tools:
        if t.binary:
            dest = root / "usr/local/bin" / t.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(t.resolved, dest)          # type: ignore[arg-type]
            dest.chmod(0o755)
    built = [t for t in tools if t.source]
    if not built:
        return
    subject = f"source tool {built[0].name}"
    before = set(_chroot(root, "dpkg-query -W -f '${Package}\\n'", "listing packages", subject).split())
    packages = set(_BASE_PACKAGES)
    for t in built:
        packages.update(t.packages)
        if t.build == "autotools" and not _has_configure(t):
            packages.update(_AUTORECONF_PACKAGES)
    with _apt_root(root):
        log.info("installing build packages %s", " ".join(sorted(packages)))
        _apt_install(root, packages, "installing build packages", subject)
        for t in built:
            _build(root, t)
        added = set(_chroot(root, "dpkg-query -W -f '${Package}\\n'", "listing packages",
                            subject).split()) - before
        # A -dev package pulled in its runtime library (libssl-dev: libssl3): the tools now
        # link against it, so it stays; only what the build alone needed goes.
        added -= _runtime_packages(root, built)
        if added:
            _chroot(root, "DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "
                    + " ".join(sorted(added)) + " && apt-get clean", "removing build packages", subject)


#: The nodes apt, dpkg and compilers open. An unpacked image root (debugfs rdump) has none;
#: at boot devtmpfs covers /dev, so they are removed again after the build.
_NODES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9),
          "tty": (5, 0)}


def _device_nodes(root: Path) -> list[Path]:
    import os
    import stat
    made = []
    (root / "dev").mkdir(exist_ok=True)
    for name, (major, minor) in _NODES.items():
        node = root / "dev" / name
        if not node.exists() and not node.is_symlink():
            os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            os.chmod(node, 0o666)
            made.append(node)
    return made


def _runtime_packages(root: Path, tools: list[SourceTool]) -> set[str]:
    """The packages owning the shared libraries the built tools load (ldd in the root)."""
    libs: set[str] = set()
    for t in tools:
        out = proc.run(["chroot", str(root), "ldd", f"/usr/local/bin/{t.name}"], timeout=60, check=False).stdout
        # merged /usr: ldd says /lib/..., dpkg knows the file as /usr/lib/...
        libs.update("/usr" + m if m.startswith("/lib") else m for m in re.findall(r"=>\s+(/\S+)", out))
    if not libs:
        return set()
    owners = proc.run(["chroot", str(root), "dpkg", "-S", *sorted(libs)], timeout=60, check=False).stdout
    # "libssl3:amd64: /usr/lib/x86_64-linux-gnu/libssl.so.3"
    return {ln.split(":")[0] for ln in owners.splitlines() if ":" in ln}


def _has_configure(t: SourceTool) -> bool:
    p = t.resolved
    if p is None:
        return False
    if p.is_dir():
        return (p / "configure").is_file()
    with tarfile.open(p) as tf:
        return any(n.count("/") <= 1 and n.rstrip("/").endswith("/configure") or n == "configure"
                   for n in tf.getnames())


def _build(root: Path, t: SourceTool) -> None:
    work = root / "tmp" / f"tb-src-{t.name}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        assert t.resolved is not None
        if t.resolved.is_dir():
            shutil.copytree(t.resolved, work / "src", ignore=shutil.ignore_patterns(".git"))
        else:
            with tarfile.open(t.resolved) as tf:
                tf.extractall(work / "unpacked", filter="data")
            tops = list((work / "unpacked").iterdir())
            (tops[0] if len(tops) == 1 and tops[0].is_dir() else work / "unpacked").rename(work / "src")
        src = f"/tmp/tb-src-{t.name}/src"
        cd = f"cd {shlex.quote(src)}"
        if t.build == "autotools":
            steps = [("autoreconf", f"{cd} && {{ [ -x configure ] || autoreconf -fi; }}"),
                     ("configure", f"{cd} && ./configure --prefix=/usr/local"),
                     ("make", f"{cd} && make -j2"), ("make install", f"{cd} && make install")]
        else:
            steps = [("make", f"{cd} && make -j2"),
                     ("make install", f"{cd} && make install PREFIX=/usr/local")]
        for step, script in steps:
            log.info("source tool %s: %s", t.name, step)
            _chroot(root, script, step, f"source tool {t.name}")
        if not (root / "usr/local/bin" / t.name).is_file():
            raise BuildError(f"source tool {t.name}: the build installed no /usr/local/bin/{t.name}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def versions(root: Path, tools: tuple[SourceTool, ...]) -> dict[str, str | None]:
    """Each tool's version as it reports it, run inside the image root (the guest's own binary)."""
    out: dict[str, str | None] = {}
    for t in tools:
        argv = " ".join(shlex.quote(a) for a in (f"/usr/local/bin/{t.name}", *t.version_args))
        try:
            text = proc.run(["chroot", str(root), "/bin/sh", "-c", argv + " 2>&1"], timeout=30,
                            check=False).stdout
        except CommandError:
            text = ""
        out[t.name] = first_version(text)
    return out


def first_version(text: str) -> str | None:
    """The version on a tool's version line: "Uperf Version 1.0.8", "tbhello 0.3"."""
    m = re.search(r"(?im)^\S*(?:\s+version)?\s+v?(\d+(?:\.\d+)+)\b", text or "")
    return m.group(1) if m else None
