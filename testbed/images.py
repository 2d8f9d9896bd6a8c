"""Build and cache guest images from recipes in images/, and make per-guest overlays.

An image is built once per recipe content: the cache key is a hash of every file in the
recipe folder, so editing the recipe rebuilds it and nothing else does. The build uses
mmdebstrap into a directory, `mkfs.ext4 -d` (no loop mounts, which containers often lack)
and `qemu-img convert`. The kernel and initrd are kept beside the disk for direct kernel
boot, which skips firmware and bootloader time.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import dataclasses
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from testbed import PREFIX, paths, proc, srctools
from testbed.errors import CapabilityError, CommandError, ConfigError, TestbedError

log = logging.getLogger(__name__)

#: Bump when the build procedure changes in a way the recipe hash cannot see.
BUILDER_VERSION = "2"   # 2: the manifest records the traffic tools and their versions


@dataclass(frozen=True)
class Recipe:
    name: str
    folder: Path
    suite: str
    mirror: str
    components: tuple[str, ...]
    variant: str
    kernel_package: str
    packages: tuple[str, ...]
    disk_size: str
    kernel_cmdline: str
    #: tools built from source (or copied as static binaries) into /usr/local/bin
    source_tools: tuple[srctools.SourceTool, ...] = ()
    #: derive from this recipe's cached image root instead of running mmdebstrap: only the
    #: source tools are added, which costs seconds plus the build, not a whole bootstrap
    base: Recipe | None = None

    def digest(self) -> str:
        h = hashlib.sha256(BUILDER_VERSION.encode())
        if self.base is not None:
            h.update(b"base:" + self.base.digest().encode())
        for p in sorted(self.folder.rglob("*")):
            if p.is_file() and ".git" not in p.relative_to(self.folder).parts:
                h.update(str(p.relative_to(self.folder)).encode())
                h.update(p.read_bytes())
        for t in self.source_tools:          # a source outside the folder counts too
            h.update(srctools.digest(t).encode())
        return h.hexdigest()[:16]


@dataclass(frozen=True)
class Image:
    """A built image: what a domain needs to boot it."""

    name: str
    digest: str
    disk: Path                 # qcow2 base; guests get overlays on top
    kernel: Path | None        # None for a user cloud image (boots its own bootloader)
    initrd: Path | None
    cmdline: str
    kernel_version: str | None = None
    #: traffic tools in the image and their versions as the image's own binaries report
    #: them; None: not recorded (a user image, or one built before tools were recorded)
    tools: dict[str, str | None] | None = None

    def missing(self, tool: str) -> bool | None:
        """True/False when the image records its tools; None when only the guest can tell."""
        return None if self.tools is None else tool not in self.tools


def load_recipe(name: str | Path | None = None) -> Recipe:
    """A recipe by name (a folder under images/) or by folder path. No name: $TESTBED_IMAGE,
    else debian12, so a run can use an image with source-built tools without a code change."""
    name = name or os.environ.get("TESTBED_IMAGE") or "debian12"
    folder = Path(name) if isinstance(name, Path) or "/" in name else paths.images_dir() / name
    file = folder / "recipe.yaml"
    if not file.is_file():
        raise ConfigError(str(file), "image", f"no recipe named {str(name)!r}")
    data = yaml.safe_load(file.read_text()) or {}
    base = None
    if "base" in data:
        if not isinstance(data["base"], str) or data["base"] == data.get("name"):
            raise ConfigError(str(file), "base", "must name another recipe")
        base = load_recipe(data["base"])
        inherited = dict(suite=base.suite, mirror=base.mirror, components=base.components,
                         variant=base.variant, kernel_package=base.kernel_package,
                         packages=base.packages, disk_size=base.disk_size,
                         kernel_cmdline=base.kernel_cmdline)
        extra = set(data) & (set(inherited) - {"disk_size"})
        if extra:
            raise ConfigError(str(file), sorted(extra)[0], "comes from the base recipe; a derived "
                              "recipe adds source_tools (and may set disk_size) only")
        data = {**inherited, **data}
    tools = srctools.parse(str(file), folder, data.get("source_tools"))
    try:
        return Recipe(name=data["name"], folder=folder, suite=data["suite"], mirror=data["mirror"],
                      components=tuple(data["components"]), variant=data["variant"],
                      kernel_package=data["kernel_package"], packages=tuple(data["packages"]),
                      disk_size=str(data["disk_size"]), kernel_cmdline=data["kernel_cmdline"],
                      source_tools=tools, base=base)
    except KeyError as e:
        raise ConfigError(str(file), str(e.args[0]), "missing") from None


def cached(recipe: Recipe) -> Image | None:
    out = paths.cache_dir() / "images" / f"{recipe.name}-{recipe.digest()}"
    manifest = out / "manifest.json"
    if not manifest.is_file():
        return None
    m = json.loads(manifest.read_text())
    return Image(name=recipe.name, digest=recipe.digest(), disk=out / "root.qcow2",
                 kernel=out / "vmlinuz", initrd=out / "initrd.img", cmdline=recipe.kernel_cmdline,
                 kernel_version=m.get("kernel_version"), tools=m.get("tools"))


def ensure(recipe: Recipe | None = None) -> Image:
    """Return the cached image for the recipe, building it first if needed."""
    recipe = recipe or load_recipe()
    img = cached(recipe)
    if img:
        log.info("image %s-%s is cached", recipe.name, recipe.digest())
        return img
    build(recipe)
    img = cached(recipe)
    assert img is not None
    return img


def build(recipe: Recipe) -> None:
    final = paths.cache_dir() / "images" / f"{recipe.name}-{recipe.digest()}"
    final.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the final place and rename at the end, so a crash never leaves a
    # half-built image that looks cached.
    # The builder's pid in the name (as guest snapshots have it): `testbed cleanup` removes a
    # build folder only once its builder is dead (SIGKILL skips the except below).
    work = Path(tempfile.mkdtemp(prefix=f"{PREFIX}build-{recipe.name}-{os.getpid()}-", dir=final.parent))
    try:
        root = work / "root"
        if recipe.base is not None:
            _unpack_base(ensure(recipe.base), work, root)
        else:
            log.info("building image %s (mmdebstrap %s)", recipe.name, recipe.suite)
            proc.run(["mmdebstrap", f"--variant={recipe.variant}",
                      f"--components={','.join(recipe.components)}",
                      f"--include={','.join((recipe.kernel_package, *recipe.packages))}",
                      f"--customize-hook={recipe.folder / 'customize.sh'}",
                      recipe.suite, str(root), recipe.mirror], timeout=1800)
        srctools.install(root, recipe.source_tools)
        tools = {**tool_versions_in(root), **srctools.versions(root, recipe.source_tools)}
        vmlinuz = sorted((root / "boot").glob("vmlinuz-*"))
        initrd = sorted((root / "boot").glob("initrd.img-*"))
        if not vmlinuz or not initrd:
            raise TestbedError(f"image {recipe.name}: no kernel or initrd in /boot after build")
        shutil.copy2(vmlinuz[-1], work / "vmlinuz")
        shutil.copy2(initrd[-1], work / "initrd.img")
        kver = vmlinuz[-1].name.removeprefix("vmlinuz-")
        raw = work / "root.ext4"
        proc.run(["mkfs.ext4", "-q", "-F", "-L", "root", "-d", str(root), str(raw), recipe.disk_size],
                 timeout=600)
        proc.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(work / "root.qcow2")],
                 timeout=600)
        raw.unlink()
        shutil.rmtree(root)
        (work / "manifest.json").write_text(json.dumps(
            {"name": recipe.name, "digest": recipe.digest(), "kernel_version": kver,
             "packages": [recipe.kernel_package, *recipe.packages], "suite": recipe.suite,
             "base": recipe.base.name if recipe.base else None,
             "source_tools": [{"name": t.name, "source": t.source, "binary": t.binary,
                               "build": t.build, "sha256": srctools.digest(t)}
                              for t in recipe.source_tools],
             "tools": tools}, indent=2))
        # Readable by libvirt's QEMU user: it opens the base image and the kernel.
        os.chmod(work, 0o755)
        for f in work.iterdir():
            os.chmod(f, 0o644)
        os.replace(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


#: Traffic tools a guest may carry, how each reports its version, and where it lives.
TOOL_VERSION = {
    "netperf": (["-V"], r"[Vv]ersion (\d+(?:\.\d+)+)"),
    "iperf3": (["--version"], r"iperf (\d+(?:\.\d+)+)"),
    "uperf": (["-V"], r"(?m)^Uperf(?:_slave)? Version (\d+(?:\.\d+)+)"),
}


def tool_versions_in(root: Path) -> dict[str, str | None]:
    """The traffic tools present in an image root, each asked for its version there."""
    out: dict[str, str | None] = {}
    for name, (args, pattern) in TOOL_VERSION.items():
        found = next((d for d in ("usr/local/bin", "usr/bin") if (root / d / name).is_file()), None)
        if found is None:
            continue
        try:
            text = proc.run(["chroot", str(root), f"/{found}/{name}", *args], timeout=30, check=False)
            m = re.search(pattern, text.stdout + text.stderr)
        except CommandError:
            m = None
        out[name] = m.group(1) if m else None
    return out


def _unpack_base(base: Image, work: Path, root: Path) -> None:
    """The base image's root filesystem as a folder, without a loop mount: debugfs rdump
    keeps owners and permissions but drops setuid/setgid bits, so those are put back from
    debugfs's own listing of the same filesystem."""
    raw = work / "base.ext4"
    proc.run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw", str(base.disk), str(raw)], timeout=600)
    root.mkdir()
    proc.run(["debugfs", "-R", f"rdump / {root}", str(raw)], timeout=600)
    dirs = ["/"] + ["/" + str(p.relative_to(root)) for p in root.rglob("*")
                    if p.is_dir() and not p.is_symlink()]
    cmds = work / "debugfs.cmds"
    cmds.write_text("".join(f'ls -p "{d}"\n' for d in dirs))
    listing = proc.run(["debugfs", "-f", str(cmds), str(raw)], timeout=600).stdout
    current = "/"
    for line in listing.splitlines():
        if line.startswith("debugfs: ls -p"):
            current = line.split('"')[1] if '"' in line else current
            continue
        parts = line.split("/")
        if len(parts) >= 7 and parts[2].isdigit():
            mode = int(parts[2], 8)
            if mode & 0o6000 and parts[5] not in (".", ".."):
                target = root / current.lstrip("/") / parts[5]
                if target.is_file() and not target.is_symlink():
                    os.chmod(target, mode & 0o7777)
    raw.unlink()
    cmds.unlink()


def partial_builds() -> list[Path]:
    """Temporary folders of image builds (finished or not: the caller checks the builder)."""
    d = paths.cache_dir() / "images"
    return sorted(p for p in d.glob(f"{PREFIX}build-*") if p.is_dir()) if d.is_dir() else []


def user_image(path: str) -> Image:
    """A user-supplied qcow2 cloud image with cloud-init; it boots through its own bootloader."""
    p = Path(path)
    return Image(name=p.name, digest="user", disk=p, kernel=None, initrd=None, cmdline="")


@contextlib.contextmanager
def overlay(base: Image, path: Path) -> Iterator[Path]:
    """A qcow2 overlay on the cached base; the base is never written. Removed on exit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    proc.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base.disk),
              str(path)], timeout=60)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def stage(shell, img: Image, *, root: Path | None = None) -> Image:
    """``img`` on the host behind ``shell`` (remote.Shell): the cached folder copied there once,
    at the same path (or under ``root``), through a tb- temporary folder renamed at the end so
    a broken copy never looks staged; the manifest goes last. A user image must already be at
    its path on that host."""
    if not shell.remote:
        return img
    if img.kernel is None:
        if not shell.exists(str(img.disk)):
            raise CapabilityError(f"host {shell.host.name}: user image {img.disk} is not there "
                                  "(copy it to the same path on that host)")
        return img
    folder = img.disk.parent
    dest = (root / folder.name) if root else folder
    staged = dataclasses.replace(img, disk=dest / img.disk.name, kernel=dest / img.kernel.name,
                                 initrd=dest / img.initrd.name if img.initrd else None)
    if shell.exists(str(dest / "manifest.json")):
        return staged
    log.info("staging image %s on host %s", folder.name, shell.host.name)
    tmp = f"{dest.parent}/{PREFIX}stage-{folder.name}-{os.getpid()}"
    shell.run(["mkdir", "-p", tmp])
    try:
        files = sorted(folder.iterdir(), key=lambda f: f.name == "manifest.json")
        for f in files:
            shell.put(f, f"{tmp}/{f.name}")
        shell.run(["chmod", "-R", "a+rX", tmp])
        shell.run(["mv", "-T", tmp, str(dest)])
    except BaseException:
        shell.run(["rm", "-rf", "--", tmp], check=False)
        raise
    return staged


def cached_images() -> list[tuple[Path, str]]:
    """Image folders in the cache, each as current (its recipe's digest now), stale (a
    recipe of this checkout, other digest) or foreign (no recipe here: never pruned)."""
    d = paths.cache_dir() / "images"
    recipes = {}
    for f in sorted(paths.images_dir().glob("*/recipe.yaml")):
        with contextlib.suppress(ConfigError, KeyError, TypeError, yaml.YAMLError):
            r = load_recipe(f.parent.name)
            recipes[r.name] = r.digest()
    out = []
    for p in sorted(d.iterdir()) if d.is_dir() else ():
        name, _, digest = p.name.rpartition("-")
        if p.is_dir() and not p.name.startswith(PREFIX):
            out.append((p, "foreign" if name not in recipes else "current" if digest == recipes[name] else "stale"))
    return out
