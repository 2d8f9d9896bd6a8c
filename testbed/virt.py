"""libvirt lifecycle: connect, define, start, hot-plug, destroy, and readiness waits."""
from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import libvirt

from testbed import images, paths, proc, remote, render
from testbed.errors import CommandError, ReadinessError, TestbedError
from testbed.guest import Agent
from testbed.model import Accelerator, GuestSpec

log = logging.getLogger(__name__)

BOOT_FINISHED = "/var/lib/cloud/instance/boot-finished"

# libvirt prints every error to stderr by default; we raise them as exceptions instead.
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


@contextlib.contextmanager
def connect(uri: str) -> Iterator[libvirt.virConnect]:
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as e:
        raise TestbedError(f"cannot connect to libvirt at {uri}: {e.get_error_message()}") from None
    try:
        yield conn
    finally:
        with contextlib.suppress(libvirt.libvirtError):
            conn.close()


def destroy(dom: libvirt.virDomain) -> None:
    """Stop and forget a domain; tolerates 'already gone'."""
    with contextlib.suppress(libvirt.libvirtError):
        if dom.isActive():
            dom.destroy()
    with contextlib.suppress(libvirt.libvirtError):
        dom.undefine()


@contextlib.contextmanager
def domain(conn: libvirt.virConnect, xml: str) -> Iterator[libvirt.virDomain]:
    try:
        dom = conn.defineXML(xml)
    except libvirt.libvirtError as e:
        raise TestbedError(f"libvirt rejected the domain: {e.get_error_message()}") from None
    try:
        try:
            dom.create()
        except libvirt.libvirtError as e:
            raise TestbedError(f"domain {dom.name()} did not start: {e.get_error_message()}") from None
        yield dom
    finally:
        destroy(dom)


def console_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return tail_text(text, lines)


def tail_text(text: str, lines: int = 15) -> str:
    keep = [ln.rstrip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    return "\n".join(keep[-lines:])


@dataclass
class Guest:
    """A booted guest: its domain, agent and where its console goes."""

    spec: GuestSpec
    name: str                  # libvirt domain name (tb- prefixed)
    dom: libvirt.virDomain
    agent: Agent
    console_log: Path          # on the guest's host
    boot_started: float        # time.monotonic() at dom.create()
    ready_s: float | None = None
    #: commands on the guest's host; None: this machine
    shell: remote.Shell | None = None

    def console_tail(self) -> str:
        if self.shell is None or not self.shell.remote:
            return console_tail(self.console_log)
        try:
            return tail_text(self.shell.read(str(self.console_log)))
        except CommandError:
            return ""

    def wait_ready(self, timeout: float) -> float:
        """Wait for the agent, then for cloud-init's final stage. Returns seconds since start."""
        deadline = self.boot_started + timeout
        for what, check in (("guest agent", self._agent_up), ("cloud-init final", self._cloud_init_done)):
            while not check():
                if not self.dom.isActive():
                    raise ReadinessError(f"guest {self.name} stopped while waiting for {what}",
                                         time.monotonic() - self.boot_started,
                                         self.console_tail())
                if time.monotonic() > deadline:
                    raise ReadinessError(f"guest {self.name} (waiting for {what})", timeout,
                                         self.console_tail())
                time.sleep(0.2)
        self.ready_s = time.monotonic() - self.boot_started
        return self.ready_s

    def _agent_up(self) -> bool:
        return self.agent.ping()

    def _cloud_init_done(self) -> bool:
        return self.agent.run(["/usr/bin/test", "-e", BOOT_FINISHED], check=False, timeout=10).rc == 0


def _seed_iso(files: render.SeedFiles, out: Path) -> Path:
    src = out.with_suffix(".d")
    src.mkdir(parents=True, exist_ok=True)
    (src / "user-data").write_text(files.user_data)
    (src / "meta-data").write_text(files.meta_data)
    (src / "network-config").write_text(files.network_config)
    proc.run(["genisoimage", "-quiet", "-output", str(out), "-volid", "cidata", "-joliet", "-rock",
              str(src / "user-data"), str(src / "meta-data"), str(src / "network-config")], timeout=60)
    return out


@contextlib.contextmanager
def _remote_files(shell: remote.Shell, image: images.Image, seed: Path, state: Path,
                  name: str) -> Iterator[tuple[Path, Path, Path, images.Image]]:
    """A remote guest's files in its own tb- folder on its host (the domain's name + .d, so it
    carries the run's tag): overlay, seed and console
    log ((disk, seed, console, image as staged there)). On exit the console log is fetched
    into the local state folder (the run keeps it) and the folder is removed."""
    img = images.stage(shell, image)
    rstate = paths.state_dir() / f"{name}.d"
    shell.run(["mkdir", "-p", str(rstate)])
    try:
        disk, rseed, console = rstate / f"{name}.qcow2", rstate / seed.name, rstate / f"{name}.console.log"
        shell.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(img.disk), str(disk)])
        shell.put(seed, str(rseed))
        yield disk, rseed, console, img
    finally:
        with contextlib.suppress(CommandError):
            (state / f"{name}.console.log").write_text(shell.read(str(console)))
        shell.run(["rm", "-rf", "--", str(rstate)], check=False)


@contextlib.contextmanager
def guest(conn: libvirt.virConnect, spec: GuestSpec, image: images.Image, accel: Accelerator,
          run_id: str, run_tag: str, state: Path, shell: remote.Shell | None = None,
          emulator: str | None = None, machine: str | None = None) -> Iterator[Guest]:
    """Boot one guest from its own overlay, on the host behind ``conn`` (and ``shell`` for a
    remote one); destroyed and its files removed on exit."""
    name = f"tb-{run_tag}-{spec.name}"
    state.mkdir(parents=True, exist_ok=True)
    console = state / f"{name}.console.log"
    with contextlib.ExitStack() as stack:
        local_seed = _seed_iso(render.cloud_init(hostname=spec.name, run_id=run_id,
                                                 instance_id=f"{name}-{run_id}"), state / f"{name}-seed.iso")
        stack.callback(lambda: local_seed.unlink(missing_ok=True))
        seed = local_seed
        if shell is not None and shell.remote:
            disk, seed, console, image = stack.enter_context(_remote_files(shell, image, local_seed, state, name))
        else:
            disk = stack.enter_context(images.overlay(image, state / f"{name}.qcow2"))
        xml = render.domain_xml(render.DomainParams(
            name=name, run_id=run_id, domain_type=accel.domain_type, memory_mib=spec.memory_mib,
            vcpus=spec.vcpus, disk=str(disk), seed=str(seed), console_log=str(console),
            kernel=str(image.kernel) if image.kernel else None,
            initrd=str(image.initrd) if image.initrd else None, cmdline=image.cmdline,
            # a variant's QEMU binary and machine type (matrix.variants); else the defaults
            **({"emulator": emulator} if emulator else {}),
            **({"machine": machine} if machine else {})))
        (state / f"{name}.xml").write_text(xml)
        started = time.monotonic()
        dom = stack.enter_context(domain(conn, xml))
        log.info("started guest %s (%s)", name, accel.value)
        yield Guest(spec=spec, name=name, dom=dom, agent=Agent(dom, name), console_log=console,
                    boot_started=started, shell=shell)


def guest_ifname(g: Guest, mac: str) -> str | None:
    res = g.agent.run(["/usr/sbin/ip", "-j", "link", "show"], timeout=15)
    for link in json.loads(res.stdout or "[]"):
        if link.get("address", "").lower() == mac.lower():
            return link["ifname"]
    return None


@contextlib.contextmanager
def plugged_nic(g: Guest, xml: str, mac: str, timeout: float = 60) -> Iterator[str]:
    """Hot-plug a NIC under test into a running guest; yields its name inside the guest.
    Unplugged on exit, waiting until libvirt reports it gone so the next plug can reuse the slot."""
    try:
        g.dom.attachDeviceFlags(xml, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    except libvirt.libvirtError as e:
        raise TestbedError(f"guest {g.name}: hot-plug failed: {e.get_error_message()}") from None
    try:
        deadline = time.monotonic() + timeout
        while (ifname := guest_ifname(g, mac)) is None:
            if time.monotonic() > deadline:
                raise ReadinessError(f"NIC {mac} in guest {g.name}", timeout, g.console_tail())
            time.sleep(0.3)
        yield ifname
    finally:
        _unplug(g, xml, mac)


def _unplug(g: Guest, xml: str, mac: str, timeout: float = 30) -> None:
    with contextlib.suppress(libvirt.libvirtError):
        if not g.dom.isActive():
            return
        g.dom.detachDeviceFlags(xml, libvirt.VIR_DOMAIN_AFFECT_LIVE)
        deadline = time.monotonic() + timeout
        while mac.lower() in g.dom.XMLDesc(0).lower():
            if time.monotonic() > deadline:
                log.warning("guest %s: NIC %s still present %ds after unplug", g.name, mac, timeout)
                return
            time.sleep(0.2)


def qemu_pid(g: Guest) -> int | None:
    """The QEMU process of a running domain, from libvirt's pid file."""
    try:
        return int(Path(f"/run/libvirt/qemu/{g.name}.pid").read_text().strip())
    except (OSError, ValueError):
        return None
