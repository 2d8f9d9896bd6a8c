"""Build and cache guest images from recipes in images/, and make per-guest overlays.

An image is built once per recipe content: the cache key is a hash of every file in the
recipe folder, so editing the recipe rebuilds it and nothing else does. The build uses
mmdebstrap into a directory, `mkfs.ext4 -d` (no loop mounts, which containers often lack)
and `qemu-img convert`. The kernel and initrd are kept beside the disk for direct kernel
boot, which skips firmware and bootloader time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from testbed import PREFIX, tools
from testbed.errors import CapabilityError, CommandError, ConfigError, TestbedError
from testbed.guests import srctools
from testbed.host import paths, proc
from testbed.topology import yamlnode

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
    #: source tools and the added packages go in, which costs seconds plus the build and the
    #: download, not a whole bootstrap
    base: Recipe | None = None
    #: a derived recipe's own Debian packages, installed into the base's root (``packages``
    #: holds the base's and these)
    added_packages: tuple[str, ...] = ()

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
    #: this build of the disk (its file's inode and modification time): an image rebuilt
    #: from the same recipe has the recipe's digest but other blocks, and a guest state saved
    #: on the old one, restored on the new, reads a file system that is no longer there
    #: (exec failed "Bad message")
    build: str = ""

    def missing(self, tool: str) -> bool | None:
        """True/False when the image records its tools; None when only the guest can tell."""
        return None if self.tools is None else tool not in self.tools


#: what a recipe may say, and in what form (checked before anything is built or fetched)
RECIPE_KEYS = {"name", "suite", "mirror", "components", "variant", "kernel_package", "packages",
               "disk_size", "kernel_cmdline", "source_tools", "base"}
_PLAIN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_MIRROR = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%/+-]*)?")
_VARIANTS = ("extract", "custom", "essential", "apt", "required", "minbase", "buildd",
             "important", "debootstrap", "standard")
_SIZE = re.compile(r"([0-9]{1,6})([KMGT]?)")
#: a guest disk between these bounds; a recipe asking for 100 ZB is a typo or an attack
DISK_MIN, DISK_MAX = 256 * 2**20, 2 * 2**40
#: how large a recipe file may be
RECIPE_MAX_BYTES = 64 * 1024


def disk_bytes(text: str) -> int | None:
    m = _SIZE.fullmatch(text)
    if not m:
        return None
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2)]


def _recipe_folder(name: str | Path) -> Path:
    if isinstance(name, Path) or "/" in str(name):
        return Path(name)
    if not _PLAIN.fullmatch(str(name)):
        raise ConfigError("TESTBED_IMAGE" if os.environ.get("TESTBED_IMAGE") == name else "recipe",
                          "image", f"{str(name)!r} is not a recipe name (lower-case letters, "
                                   f"digits, '.', '_', '-') nor a recipe folder")
    return paths.images_dir() / str(name)


def load_recipe(name: str | Path | None = None, _depth: int = 0) -> Recipe:
    """A recipe by name (a folder under images/) or by folder path. No name: $TESTBED_IMAGE,
    else debian12, so a run can use an image with source-built tools without a code change.

    Validated in full before anything is built, fetched or created: the YAML (one line with
    file and line when malformed), every field's form (plain names, Debian package names, an
    http(s) mirror, a sane disk size that fits the cache's free space), and every path the
    recipe uses resolved inside its folder."""
    name = name or os.environ.get("TESTBED_IMAGE") or "debian12"
    folder = _recipe_folder(name)
    file = folder / "recipe.yaml"
    fname = str(file)
    if not file.exists():
        raise ConfigError(fname, "image", f"no recipe named {str(name)!r}")
    try:
        if not file.resolve().is_relative_to(folder.resolve()):
            raise ConfigError(fname, "(file)", "a symbolic link out of the recipe folder")
    except (OSError, RuntimeError) as e:
        raise ConfigError(fname, "(file)", f"cannot be resolved: {e}") from None
    root = yamlnode.Node(fname, yamlnode.compose(yamlnode.read_text(file, RECIPE_MAX_BYTES), fname, "recipe"), "")
    m = root.mapping(RECIPE_KEYS)
    data: dict = {}
    for key in ("name", "suite", "variant", "kernel_package", "base"):
        if key in m:
            data[key] = m[key].str(_PLAIN if key != "kernel_package" else srctools.PACKAGE,
                                   "plain name" if key != "kernel_package" else "package name")
    if "name" not in m:
        raise root.error("missing required key 'name'")
    if "mirror" in m:
        data["mirror"] = m["mirror"].str(_MIRROR, "http(s) URL")
    if "variant" in m and data["variant"] not in _VARIANTS:
        raise m["variant"].error(f"unknown variant {data['variant']!r} (one of {', '.join(_VARIANTS)})")
    if "components" in m:
        data["components"] = [c.str(_PLAIN, "component") for c in m["components"].seq(1)]
    if "packages" in m:
        data["packages"] = [c.str(srctools.PACKAGE, "Debian package name") for c in m["packages"].seq()]
    if "disk_size" in m:
        raw = m["disk_size"].scalar()
        size = disk_bytes(str(raw)) if isinstance(raw, (str, int)) and not isinstance(raw, bool) else None
        if size is None:
            raise m["disk_size"].error(f"{raw!r}: a size such as 2G or 1536M")
        if not DISK_MIN <= size <= DISK_MAX:
            raise m["disk_size"].error(f"{raw!r}: out of range {DISK_MIN // 2**20}M..{DISK_MAX // 2**40}T")
        data["disk_size"] = str(raw)
    if "kernel_cmdline" in m:
        cmd = m["kernel_cmdline"].str()
        if len(cmd) > 1024 or not cmd.isprintable():
            raise m["kernel_cmdline"].error("at most 1024 printable characters")
        data["kernel_cmdline"] = cmd
    base, added = None, ()
    if "base" in data:
        if data["base"] == data.get("name") or _depth > 4:
            raise m["base"].error("must name another recipe")
        base = load_recipe(data["base"], _depth + 1)
        inherited = dict(suite=base.suite, mirror=base.mirror, components=base.components,
                         variant=base.variant, kernel_package=base.kernel_package,
                         packages=base.packages, disk_size=base.disk_size,
                         kernel_cmdline=base.kernel_cmdline)
        extra = set(data) & (set(inherited) - {"disk_size", "packages"})
        if extra:
            raise ConfigError(fname, sorted(extra)[0], "comes from the base recipe; a derived "
                              "recipe adds packages and source_tools (and may set disk_size) only")
        added = tuple(p for p in data.pop("packages", []) if p not in base.packages)
        data = {**inherited, **data, "packages": [*base.packages, *added]}
    else:
        hook = folder / "customize.sh"
        if not hook.is_file():
            raise ConfigError(fname, "customize.sh", f"{hook} is missing (a bootstrapped recipe "
                                                     f"needs its customize hook)")
        if not hook.resolve().is_relative_to(folder.resolve()):
            raise ConfigError(fname, "customize.sh", "a symbolic link out of the recipe folder")
    for key in ("suite", "mirror", "components", "variant", "kernel_package", "packages",
                "disk_size", "kernel_cmdline"):
        if key not in data:
            raise root.error(f"missing required key {key!r}")
    # The plain YAML, for the source tools' own checks (their fields were composed safely).
    raw_tools = yaml.safe_load(file.read_text()).get("source_tools") if "source_tools" in m else None
    tools = srctools.parse(fname, folder, raw_tools)
    return Recipe(name=data["name"], folder=folder, suite=data["suite"], mirror=data["mirror"],
                  components=tuple(data["components"]), variant=data["variant"],
                  kernel_package=data["kernel_package"], packages=tuple(data["packages"]),
                  disk_size=str(data["disk_size"]), kernel_cmdline=data["kernel_cmdline"],
                  source_tools=tools, base=base, added_packages=added)


def check_space(recipe: Recipe) -> None:
    """Refuse a build whose disk (twice: the ext4 file and its qcow2 copy) does not fit the
    cache's file system, before anything is created there."""
    need = 2 * (disk_bytes(recipe.disk_size) or 0)
    where = paths.cache_dir()
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need > free:
        raise CapabilityError(f"{recipe.folder / 'recipe.yaml'}: disk_size: {recipe.disk_size} needs "
                              f"{need / 2**30:.1f} GiB in {where}, which has {free / 2**30:.1f} GiB free")


def cached(recipe: Recipe) -> Image | None:
    out = paths.cache_dir() / "images" / f"{recipe.name}-{recipe.digest()}"
    manifest = out / "manifest.json"
    if not manifest.is_file():
        return None
    m = json.loads(manifest.read_text())
    return Image(name=recipe.name, digest=recipe.digest(), disk=out / DISK,
                 kernel=out / "vmlinuz", initrd=out / "initrd.img", cmdline=recipe.kernel_cmdline,
                 kernel_version=m.get("kernel_version"), tools=m.get("tools"), build=build_of(out / DISK))


#: the disk file of a cached image's folder
DISK = "root.qcow2"


def build_of(disk: Path) -> str:
    """Which build of an image a disk file is (Image.build)."""
    try:
        st = disk.stat()
    except OSError:
        return ""
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}"


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
    check_space(recipe)
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
            srctools.add_packages(root, recipe.added_packages)
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


def tool_versions_in(root: Path) -> dict[str, str | None]:
    """The traffic tools present in an image root, each asked for its version there the way
    its driver says (ToolDriver.version_args, version_re)."""
    out: dict[str, str | None] = {}
    for d in tools.drivers():
        name, args, pattern = d.name.value, d.version_args, d.version_re
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
    return Image(name=p.name, digest="user", disk=p, kernel=None, initrd=None, cmdline="", build=build_of(p))


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
