"""Recipe source_tools: bad input names the field (exit 2), the source's bytes are part of the
image cache key, and a real compiler's error reaches the build error with its last lines."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from testbed.errors import ConfigError
from testbed.guests import images, srctools

pytestmark = pytest.mark.unit
DATA = Path(__file__).resolve().parents[1] / "vm" / "data"


def recipe_dir(tmp_path: Path, tools: str, extra: str = "") -> Path:
    folder = tmp_path / "r"
    folder.mkdir(exist_ok=True)
    shutil.copytree(DATA / "tbhello-image" / "tbhello", folder / "tbhello", dirs_exist_ok=True)
    (folder / "recipe.yaml").write_text(f"name: r\nbase: debian12\n{extra}source_tools:\n{tools}")
    return folder


def test_the_test_recipe_loads_and_derives_from_debian12() -> None:
    r = images.load_recipe(DATA / "tbhello-image")
    assert r.base is not None and r.base.name == "debian12"
    assert [(t.name, t.build) for t in r.source_tools] == [("tbhello", "autotools")]
    assert r.packages == r.base.packages and r.kernel_cmdline == r.base.kernel_cmdline


@pytest.mark.parametrize("tools,field,words", [
    ("  - {name: tbhello, source: nowhere, build: autotools}\n", "source_tools[0].source", "does not exist"),
    ("  - {name: tbhello, source: ../../etc, build: autotools}\n", "source_tools[0].source", "outside the recipe folder"),
    ("  - {name: tbhello, source: /etc, build: autotools}\n", "source_tools[0].source", "outside the recipe folder"),
    ("  - {name: tbhello, source: tbhello, build: cmake}\n", "source_tools[0].build", "one of autotools, make"),
    ("  - {name: tbhello, build: make}\n", "source_tools[0]", "exactly one of"),
    ("  - {name: TB hello, source: tbhello, build: make}\n", "source_tools[0].name", "plain"),
    ("  - {name: tbhello, binary: nowhere}\n", "source_tools[0].binary", "does not exist"),
    ("  - {name: tbhello, binary: /bin/true}\n", "source_tools[0].binary", "outside the recipe folder"),
    ("  - {name: tbhello, source: tbhello, build: make, flavour: x}\n", "source_tools[0].flavour", "unknown"),
    ("  - {name: tbhello, source: tbhello/tbhello.c, build: make}\n", "source_tools[0].source", "tarball"),
])
def test_bad_source_tools_name_the_field(tmp_path, tools, field, words) -> None:
    with pytest.raises(ConfigError) as e:
        images.load_recipe(recipe_dir(tmp_path, tools))
    assert e.value.field == field and words in e.value.message and e.value.exit_status == 2
    assert str(recipe_dir(tmp_path, tools) / "recipe.yaml") in str(e.value)


def test_a_derived_recipe_cannot_change_what_the_base_installs(tmp_path) -> None:
    folder = recipe_dir(tmp_path, "  - {name: tbhello, source: tbhello, build: autotools}\n",
                        extra="kernel_package: linux-image-amd64\n")
    with pytest.raises(ConfigError, match="kernel_package: comes from the base recipe"):
        images.load_recipe(folder)


def test_a_derived_recipe_adds_packages_to_the_bases(tmp_path) -> None:
    folder = recipe_dir(tmp_path, "  - {name: tbhello, source: tbhello, build: autotools}\n",
                        extra="packages: [bpftrace, netperf]\n")
    r = images.load_recipe(folder)
    assert r.base is not None and "netperf" in r.base.packages
    # netperf is the base's already: only bpftrace is added, and the image lists both
    assert r.added_packages == ("bpftrace",)
    assert r.packages == (*r.base.packages, "bpftrace")
    first = r.digest()
    (folder / "recipe.yaml").write_text((folder / "recipe.yaml").read_text().replace("bpftrace", "strace"))
    assert images.load_recipe(folder).digest() != first
    (folder / "recipe.yaml").write_text((folder / "recipe.yaml").read_text().replace("strace", "Bad Name"))
    with pytest.raises(ConfigError) as e:
        images.load_recipe(folder)
    assert e.value.field.startswith("packages") and "Debian package name" in e.value.message


def test_the_bpftrace_image_recipe_adds_bpftrace_to_debian12() -> None:
    r = images.load_recipe("debian12-bpftrace")
    assert r.base is not None and r.base.name == "debian12" and r.added_packages == ("bpftrace",)


def test_source_bytes_are_part_of_the_cache_key(tmp_path) -> None:
    folder = recipe_dir(tmp_path, "  - {name: tbhello, source: tbhello, build: autotools}\n")
    first = images.load_recipe(folder).digest()
    assert images.load_recipe(folder).digest() == first
    src = folder / "tbhello" / "tbhello.c"
    src.write_text(src.read_text().replace("hello from", "hello from a changed"))
    assert images.load_recipe(folder).digest() != first
    tarball = folder / "tbhello.tar.gz"
    shutil.make_archive(str(folder / "tbhello"), "gztar", folder, "tbhello")
    (folder / "recipe.yaml").write_text("name: r\nbase: debian12\nsource_tools:\n"
                                        "  - {name: tbhello, source: tbhello.tar.gz, build: autotools}\n")
    assert images.load_recipe(folder).source_tools[0].resolved == tarball.resolve()


def test_version_lines() -> None:
    assert srctools.first_version("tbhello version 0.3\n") == "0.3"
    assert srctools.first_version("Uperf Version 1.0.8\nReport bugs to a@b.c\n") == "1.0.8"
    assert srctools.first_version("no version here") is None


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("cc"), reason="needs root (chroot) and a C compiler")
def test_a_compiler_error_names_the_step_and_shows_its_last_lines(tmp_path) -> None:
    # The build runs for real, chrooted into / (this host has a compiler), on a copy of
    # tbhello with a syntax error: the error must name the step and carry cc's own words.
    broken = tmp_path / "tbbroken"
    shutil.copytree(DATA / "tbhello-image" / "tbhello", broken)
    (broken / "tbhello.c").write_text((broken / "tbhello.c").read_text().replace("return 0;\n}", "return 0\n}", 1))
    tool = srctools.SourceTool(f"tbbroken{os.getpid()}", source=str(broken), build="autotools",
                               resolved=broken)
    with pytest.raises(srctools.BuildError) as e:
        srctools._build(Path("/"), tool)
    assert f"source tool {tool.name}: make exited" in str(e.value)
    assert "error:" in str(e.value) and "tbhello.c" in str(e.value)
    assert not Path(f"/tmp/tb-src-{tool.name}").exists()
    assert not Path(f"/usr/local/bin/{tool.name}").exists()


def test_preflight_asks_the_images_tool_list_not_this_host() -> None:
    import dataclasses

    from testbed.errors import CapabilityError
    from testbed.measure import runner
    from testbed.topology import config
    from testbed.topology.model import Profile, Tool
    img = images.Image("x", "d", Path("/nonexistent"), None, None, "", tools={"netperf": "2.7.0"})
    topo = config.default()
    up = dataclasses.replace(topo, matrix=dataclasses.replace(topo.matrix, profiles=(
        Profile("u", tool=Tool("uperf"), duration_s=2),)))
    with pytest.raises(CapabilityError) as e:
        runner.guest_tools_preflight(up, runner.plan(up), img)
    assert "uperf is not in guest image x-d" in str(e.value) and e.value.exit_status == 3
    runner.guest_tools_preflight(topo, runner.plan(topo), img)       # netperf is there
    with_uperf = dataclasses.replace(img, tools={"netperf": "2.7.0", "uperf": "1.0.8"})
    runner.guest_tools_preflight(up, runner.plan(up), with_uperf)
    unknown = dataclasses.replace(img, tools=None)                    # asked of the booted guests
    runner.guest_tools_preflight(up, runner.plan(up), unknown)
