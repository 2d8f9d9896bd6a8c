"""libvirt lifecycle: connect, define, start, hot-plug, destroy, and readiness waits."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
import uuid as uuid_mod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testbed import PREFIX
from testbed.errors import CommandError, GuestError, ReadinessError, TestbedError
from testbed.guests import guestcache, images, render
from testbed.guests.guest import Agent
from testbed.guests.lazy import libvirt
from testbed.host import paths, proc, remote
from testbed.topology.model import Accelerator, GuestSpec

log = logging.getLogger(__name__)

BOOT_FINISHED = "/var/lib/cloud/instance/boot-finished"
#: seconds between two readiness checks of a booting guest (agent calls, see Guest.wait_ready)
READY_POLL_S = 0.05
#: how often a guest that is not ready yet has its console read for a kernel panic
PANIC_LOOK_S = 2.0
#: MiB of a guest's free memory left alone when the rest is zeroed before a snapshot: room
#: for the kernel's reserves and the guest's own processes meanwhile
SHRINK_KEEP_FREE_MIB = 64
#: what a restore does until the guest is ready, in order (Guest.steps times each): libvirt's
#: restore call (the save image streamed to it with this guest's XML, QEMU started, memory and
#: devices loaded), the agent's first answer, host randomness and the boot-finished check
#: through the agent's file commands, and the clock set from the host through the image's
#: clock FIFO (CLOCK_FIFO), written before those and answered beside them (both timed from
#: the same start)
RESTORE_STEPS = ("restore call", "agent", "entropy and boot check", "clock")
#: the testbed image's clock FIFO and its answer (images/debian12/files/testbed-clock): a line
#: "TOKEN SECONDS NANOSECONDS" written there sets the guest's clock with no process started
#: in the guest; the answer is "TOKEN ok" or "TOKEN error: ..."
CLOCK_FIFO = "/run/testbed/clock"
CLOCK_ANSWER = "/run/testbed/clock.set"
#: seconds a restored guest has to answer a clock line before the clock is set by a command
CLOCK_ANSWER_S = 20.0



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


def enter_parallel(stack: contextlib.ExitStack, cms: list, workers: int) -> list:
    """Enter context managers (guests being booted or restored) in up to ``workers`` threads
    and register the ones entered on ``stack``, so they are left (destroyed) with the stack,
    also when another failed or on Ctrl-C: then the ones in flight are waited for, those
    not started are cancelled, and the first error is raised. Returns what each yielded, in
    order. They are left in parallel too (exit_parallel). libvirt's connections are
    thread-safe, and each guest's calls are its own."""
    from concurrent.futures import ThreadPoolExecutor
    ex = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="tb-enter")
    futs = [ex.submit(cm.__enter__) for cm in cms]
    try:
        for f in futs:
            f.exception()           # waits; errors are raised below, after every one is known
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
        entered = [cm for cm, f in zip(cms, futs) if f.done() and not f.cancelled() and f.exception() is None]
        if entered:
            stack.push(exit_parallel(entered, workers))
    for f in futs:
        if f.exception() is not None:
            raise f.exception()     # type: ignore[misc]
    return [f.result() for f in futs]


def exit_parallel(cms: list, workers: int):
    """One exit callback (for ExitStack.push) that leaves ``cms`` in up to ``workers``
    threads: N guests are destroyed in about the time of one, not N times it. Every one is
    left, also when another's exit fails or Ctrl-C arrives meanwhile (the threads in flight
    are waited for); then the first error is raised. Never suppresses the exception it is
    given."""
    def leave(exc_type, exc, tb) -> bool:
        from concurrent.futures import ThreadPoolExecutor
        ex = ThreadPoolExecutor(max_workers=max(1, min(workers, len(cms))), thread_name_prefix="tb-exit")
        try:
            futs = [ex.submit(cm.__exit__, exc_type, exc, tb) for cm in reversed(cms)]
            for f in futs:
                f.exception()
        finally:
            ex.shutdown(wait=True)
        for f in futs:
            if f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        return False
    return leave


def map_parallel(fn, items: list, workers: int) -> list:
    """``fn`` over ``items`` in up to ``workers`` threads (readiness waits of guests that
    are independent of each other); the first error is raised once all have finished."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="tb-wait") as ex:
        futs = [ex.submit(fn, x) for x in items]
    for f in futs:
        if f.exception() is not None:
            raise f.exception()     # type: ignore[misc]
    return [f.result() for f in futs]


def destroy(dom: libvirt.virDomain) -> None:
    """Stop and forget a domain; tolerates 'already gone'."""
    name = None
    with contextlib.suppress(libvirt.libvirtError):
        name = dom.name()
        if dom.isActive():
            dom.destroy()
    with contextlib.suppress(libvirt.libvirtError):
        dom.undefine()
    forget_log(dom, name)


def forget_log(dom: libvirt.virDomain, name: str | None) -> None:
    """libvirt's log of one of our domains on this machine: it stays when the domain goes,
    so every run would leave a tb- file behind (the console log the testbed keeps is its own)."""
    local = False
    with contextlib.suppress(libvirt.libvirtError):
        local = dom.connect().getURI().startswith("qemu:///")
    if local and name and name.startswith(PREFIX):
        for f in paths.QEMU_LOG_DIR.glob(f"{name}.log*"):
            with contextlib.suppress(OSError):
                f.unlink()


@contextlib.contextmanager
def restored_domain(conn: libvirt.virConnect, image: Path, name: str) -> Iterator[libvirt.virDomain]:
    """A domain restored from a save image (transient: destroying it forgets it). Destroyed
    by its name on the way out, also when the restore failed or was interrupted half-way
    (a Ctrl-C arrives after the call returns, and the domain is ours by its name)."""
    try:
        try:
            conn.restoreFlags(str(image), None, libvirt.VIR_DOMAIN_SAVE_RUNNING)
        except libvirt.libvirtError as e:
            raise TestbedError(f"restore of {name} failed: {e.get_error_message()}") from None
        yield conn.lookupByName(name)
    finally:
        with contextlib.suppress(libvirt.libvirtError):
            destroy(conn.lookupByName(name))


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
    #: restored from a cached snapshot, or booted cold
    boot: str = "cold"
    #: the snapshot key (guestcache.Key.digest) this guest was restored from or saved to
    snapshot_key: str | None = None
    #: why a guest booted cold (no snapshot yet, key changed, restore failed, remote host)
    boot_reason: str | None = None
    #: a cold guest whose state is to be cached once ready: (key, conn, disk, seed, state)
    save_to: tuple | None = None
    snapshot_saved_s: float | None = None
    run_id: str = ""
    #: restored: seconds the restore itself took (copy of the image, restoreFlags)
    restore_s: float | None = None
    #: what the guest runs on (Accelerator's value: kvm or tcg)
    accelerator: str = ""
    #: a cold guest saved into the cache: its console as it was before the save (the
    #: restored QEMU starts the log afresh); the boot breakdown reads it (testbed.guests.bootprofile)
    boot_console: str | None = None
    #: the console log's size when this boot began: QEMU appends, and a guest booted again
    #: after a loss has its earlier life (a panic, say) above this offset
    console_from: int = 0
    #: restored: seconds of each step from the restore call to ready, in order (RESTORE_STEPS)
    steps: dict[str, float] = field(default_factory=dict)

    def record(self) -> dict:
        """What the run record says about this guest's boot."""
        return {"domain": self.name, "host": self.spec.host, "ready_s": self.ready_s, "boot": self.boot,
                "snapshot_key": self.snapshot_key, "boot_reason": self.boot_reason,
                "snapshot_saved_s": self.snapshot_saved_s,
                "restore_s": None if self.restore_s is None else round(self.restore_s, 2)}

    def console_tail(self) -> str:
        if self.shell is None or not self.shell.remote:
            return console_tail(self.console_log)
        try:
            return tail_text(self.shell.read(str(self.console_log)))
        except CommandError:
            return ""

    def console_since(self, offset: int) -> str:
        """What a local guest's console printed from byte ``offset`` on ("" while there is no
        log). A log started afresh, shorter than the offset, is read whole."""
        try:
            with open(self.console_log, "rb") as f:
                f.seek(offset if os.fstat(f.fileno()).st_size >= offset else 0)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _panicked(self) -> bool:
        """Whether this boot's console shows a kernel panic (a local guest's; a remote one's
        console costs an ssh call and is left to the deadline)."""
        if self.shell is not None and self.shell.remote:
            return False
        return "Kernel panic" in self.console_since(self.console_from)

    def wait_ready(self, timeout: float) -> float:
        """Wait for the agent, then for cloud-init's final stage (a restored guest: its clock
        set and fresh entropy given). Returns seconds since start. A cold guest that is to be
        cached is then saved and brought back from its own snapshot."""
        deadline = self.boot_started + timeout
        waited_from = time.monotonic()
        steps = ((("guest agent", self._agent_up), ("entropy, boot check and clock", self._refresh))
                 if self.boot == "restored" else
                 (("guest agent", self._agent_up), ("cloud-init final", self._cloud_init_done)))
        console_due = 0.0
        step_from = waited_from
        for what, check in steps:
            while not check():
                if not self.dom.isActive():
                    raise ReadinessError(f"guest {self.name} stopped while waiting for {what}",
                                         time.monotonic() - self.boot_started,
                                         self.console_tail())
                if time.monotonic() >= console_due:
                    # A panicked guest's domain keeps running, hung: without this look the
                    # wait would go on to its deadline (minutes) for a guest that is gone.
                    # Every few seconds, not every poll: each look reads this boot's whole
                    # console (a remote guest's is not read: see _panicked).
                    console_due = time.monotonic() + PANIC_LOOK_S
                    if self._panicked():
                        raise ReadinessError(f"guest {self.name} (kernel panic while waiting for {what})",
                                             time.monotonic() - self.boot_started, self.console_tail())
                if time.monotonic() > deadline:
                    raise ReadinessError(f"guest {self.name} (waiting for {what})", timeout,
                                         self.console_tail())
                # Each check is an agent call that starts nothing in the guest (or fails at
                # once while the agent is not connected), so it is asked often: the wait
                # ends within this interval of the guest being ready.
                time.sleep(READY_POLL_S)
            if what == "guest agent" and self.boot == "restored":
                self.steps["agent"] = time.monotonic() - step_from
            step_from = time.monotonic()
        self.ready_s = time.monotonic() - self.boot_started
        if self.restore_s is not None:
            # Restores are made before any is waited for (in parallel up to the host's
            # cores): the time a restored guest sat running while others were still being
            # restored is not its own.
            self.ready_s = self.restore_s + (time.monotonic() - waited_from)
        if self.save_to is not None:
            self._save_snapshot()
        return self.ready_s

    def _refresh(self) -> bool:
        """After a restore the guest's clock stands where it was saved, and its random state
        is the snapshot's, shared by every restore. The clock is set from the host first:
        one line into the image's clock FIFO (CLOCK_FIFO, through the agent's file commands)
        that a process saved with the guest applies. Starting a process in the guest (`date
        -s`) cost each restore an exec under TCG, the largest part of the guest's own work
        after a restore, which grew with the guests restored at once (docs/performance.md).
        While the guest applies it, host randomness is written into its /dev/urandom (mixed
        into its pool; the virtio-rng device feeds it too) and boot-finished is looked for,
        both through file commands, which start no process; then the clock's answer is read.
        An image without the FIFO (a user's own), or one whose clock process does not answer,
        gets `date -s` as before, and an agent that refuses file commands gets a shell
        command for all of it (RESTORE_STEPS names the steps, Guest.steps times them)."""
        try:
            t = time.monotonic()
            token = self._clock_line()
            pid, argv = None, None
            if token is None:
                argv = self._date_argv()
                pid = self.agent.spawn(argv)
            if not self._entropy_and_boot_check():
                res = self.agent.run(["/bin/sh", "-c", f"cat > /dev/urandom && test -e {BOOT_FINISHED}"],
                                     stdin=os.urandom(512), check=False, timeout=30)
                if res.rc != 0:
                    raise GuestError(f"guest {self.name}: after restore: rc {res.rc} {res.stderr.strip()[:200]}")
            self.steps["entropy and boot check"] = time.monotonic() - t
            if token is not None and not self._clock_answered(token):
                argv = self._date_argv()
                pid = self.agent.spawn(argv)
            if pid is not None and argv is not None:
                res = self.agent.wait(pid, argv, 30)
                if res.rc != 0:
                    raise CommandError([f"{self.name}:", *argv], res.rc, res.stderr or res.stdout)
            self.steps["clock"] = time.monotonic() - t
        except CommandError as e:
            raise GuestError(f"guest {self.name}: after restore: {e}") from None
        return True

    @staticmethod
    def _date_argv() -> list[str]:
        now = time.time_ns()
        return ["/bin/date", "-u", "-s", f"@{now // 10**9}.{now % 10**9:09d}"]

    def _clock_line(self) -> str | None:
        """Write this host's time, with a new token, into the guest's clock FIFO; the token,
        or None when the guest has no FIFO or the agent refuses file commands. Opened "r+":
        it never creates a file, and never blocks (systemd holds the FIFO open)."""
        token = uuid_mod.uuid4().hex[:16]
        now = time.time_ns()
        try:
            self.agent.write_bytes(CLOCK_FIFO, f"{token} {now // 10**9} {now % 10**9}\n".encode(), "r+")
        except GuestError:
            return None
        return token

    def _clock_answered(self, token: str) -> bool:
        """Whether the guest's clock process applied the line with this token (polled through
        the agent's file reads). False when it did not answer in CLOCK_ANSWER_S (the caller
        sets the clock by a command); an answer with an error is an error."""
        deadline = time.monotonic() + CLOCK_ANSWER_S
        while True:
            try:
                answer = self.agent.read_file(CLOCK_ANSWER).strip()
            except GuestError:
                answer = ""
            if answer.startswith(f"{token} "):
                if answer == f"{token} ok":
                    return True
                raise GuestError(f"guest {self.name}: after restore: the clock was not set: {answer[len(token) + 1:]}")
            if time.monotonic() > deadline:
                log.warning("guest %s: its clock process did not answer in %.0f s; setting the clock by a command",
                            self.name, CLOCK_ANSWER_S)
                return False
            time.sleep(0.02)

    def _entropy_and_boot_check(self) -> bool:
        """Host randomness into the guest's /dev/urandom and boot-finished looked for, through
        the agent's file commands. False: the agent refuses file commands (the caller runs a
        command instead). A restored guest without boot-finished is a broken snapshot."""
        try:
            self.agent.write_bytes("/dev/urandom", os.urandom(512))
        except GuestError:
            return False
        found = self.agent.exists(BOOT_FINISHED)
        if found is False:
            raise GuestError(f"guest {self.name}: after restore: {BOOT_FINISHED} is missing")
        return found is True

    def _save_snapshot(self) -> None:
        """Save this cold-booted, ready guest into the snapshot cache (before any NIC under
        test is plugged), then restore it from there so it runs on in this run exactly as
        later runs will: on its own overlay over the frozen layer. A snapshot that cannot be
        made is recorded as the reason, and the guest runs on as it is."""
        key, conn, disk, seed, state, replace = self.save_to
        self.save_to = None
        builder = guestcache.Builder(key)
        if self.shell is None or not self.shell.remote:
            with contextlib.suppress(OSError):
                self.boot_console = self.console_log.read_text(errors="replace")
        from testbed.host import diskspace
        try:
            short = diskspace.snapshot_shortfall(self.spec.memory_mib, Path(disk).stat().st_size,
                                                 Path(builder.state).parent)
        except OSError:
            short = None
        if short:
            # A full cache must not stop the run: the guest runs on as it is, and says why.
            builder.discard()
            self.boot_reason = f"{self.boot_reason}; snapshot not saved: {short}"
            log.warning("guest %s: snapshot not saved: %s", self.name, short)
            return
        started = time.monotonic()
        # The image's clock process starts on the first line written to its FIFO: started
        # now, it is saved with the guest, asleep in its read, and every restore's clock line
        # wakes it instead of starting a process (an image without it is saved as it is).
        # A clock process that fails is worth a warning, not the guest: its clock is right
        # (it booted cold), and each restore then sets it by a command.
        try:
            token = self._clock_line()
            if token is not None:
                self._clock_answered(token)
        except GuestError as e:
            log.warning("guest %s: %s; restores will set its clock by a command", self.name, e)
        self._shrink_before_save()
        try:
            shutil.copy2(seed, builder.seed)
            uuid = self.dom.UUIDString()
            self.dom.saveFlags(str(builder.state), None, libvirt.VIR_DOMAIN_SAVE_RUNNING)
        except (OSError, libvirt.libvirtError) as e:
            builder.discard()
            msg = e.get_error_message() if isinstance(e, libvirt.libvirtError) else str(e)
            self.boot_reason = f"{self.boot_reason}; snapshot not saved: {msg}"
            log.warning("guest %s: snapshot not saved: %s", self.name, msg)
            if not self.dom.isActive():
                raise ReadinessError(f"guest {self.name} stopped while saving its snapshot", 0,
                                     self.console_tail()) from None
            return
        # The domain is stopped now: its overlay becomes the frozen layer.
        image = state / f"{self.name}.save"
        snap = None
        try:
            shutil.move(disk, builder.disk)
            snap = builder.commit(self.name, uuid, time.monotonic() - started, replace=replace)
            self.snapshot_saved_s = round(snap.save_s, 2)
            self.snapshot_key = key.digest
            _overlay_file(snap.disk, disk)
            xml = guestcache.restore_xml(guestcache.read_image_xml(snap.state), name=self.name, uuid=uuid,
                                         run_id=self.run_id, disk=str(disk), seed=str(snap.seed),
                                         console_log=str(self.console_log))
            self.dom.undefine()     # the restored domain is transient, like every restored one
            with guestcache.streamed_image(snap.state, image, xml):
                conn.restoreFlags(str(image), None, libvirt.VIR_DOMAIN_SAVE_RUNNING)
            self.dom = self.agent.dom = conn.lookupByName(self.name)
        except (TestbedError, OSError, libvirt.libvirtError) as e:
            msg = e.get_error_message() if isinstance(e, libvirt.libvirtError) else str(e)
            builder.discard()
            if snap is not None:
                guestcache.remove(snap)
            raise ReadinessError(f"guest {self.name}: restore from its new snapshot failed ({msg}); "
                                 "snapshot removed", 0, self.console_tail()) from None
        finally:
            image.unlink(missing_ok=True)
        # Back from the snapshot, like every later restore: the clock stood still meanwhile.
        deadline = time.monotonic() + 60
        while not self._agent_up():
            if time.monotonic() > deadline or not self.dom.isActive():
                raise ReadinessError(f"guest {self.name} (agent after restore from its new snapshot)", 60,
                                     self.console_tail())
            time.sleep(0.1)
        self._refresh()
        self.steps.clear()          # a restore's steps; this guest booted cold
        log.info("guest %s: snapshot %s saved in %.1f s", self.name, key.digest, self.snapshot_saved_s)

    def _shrink_before_save(self) -> None:
        """Leave only the memory in use for the save image to hold: the guest's page cache
        dropped (files are read again, from the host's page cache, when used), then its free
        memory zeroed by one process that takes nearly all of it (the kernel clears a page
        as it hands it out) and gives it back; QEMU writes a zero page as a marker only, and
        a restore leaves it untouched. The image, each restore's read and each restored
        guest's memory on the host shrink by what boot touched and freed (docs/images.md).
        Best effort: a guest that refuses is saved as it is."""
        try:
            self.agent.run(["/bin/sync"], timeout=60)
            self.agent.write_file("/proc/sys/vm/drop_caches", "3\n")
            free_kib = next(int(ln.split()[1]) for ln in self.agent.read_file("/proc/meminfo").splitlines()
                            if ln.startswith("MemFree:"))
            fill_mib = free_kib // 1024 - SHRINK_KEEP_FREE_MIB
            if fill_mib > 0:
                # dd's one buffer of that size, read from /dev/zero: every page touched once
                self.agent.run(["/bin/dd", "if=/dev/zero", "of=/dev/null", f"bs={fill_mib}M", "count=1",
                                "iflag=fullblock", "status=none"], timeout=300)
            self.agent.write_file("/proc/sys/vm/drop_caches", "3\n")
        except (CommandError, GuestError, StopIteration, ValueError) as e:
            log.warning("guest %s: memory not shrunk before its snapshot: %s", self.name, e)

    def _agent_up(self) -> bool:
        return self.agent.ping()

    def _cloud_init_done(self) -> bool:
        found = self.agent.exists(BOOT_FINISHED)
        if found is None:      # an agent that refuses file commands: a command in the guest
            return self.agent.run(["/usr/bin/test", "-e", BOOT_FINISHED], check=False, timeout=10).rc == 0
        return found


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
        # the domain is gone by now; libvirt's log of it on that host would stay
        shell.run(["rm", "-f", "--", str(paths.QEMU_LOG_DIR / f"{name}.log")], check=False)


#: an empty qcow2 overlay's bytes per backing file (its path and mtime): the file names its
#: backing file and holds nothing else of its own, so every overlay of one snapshot layer is
#: the same bytes; the first one is made by qemu-img, the next ones are written without
#: starting a process (a density run restores 2N clones of one snapshot)
_EMPTY_OVERLAYS: dict[tuple[str, int], bytes] = {}


def _overlay_file(backing: Path, path: Path) -> None:
    key = (str(backing), backing.stat().st_mtime_ns)
    data = _EMPTY_OVERLAYS.get(key)
    if data is not None:
        path.write_bytes(data)
        return
    proc.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(backing), str(path)],
             timeout=60)
    _EMPTY_OVERLAYS[key] = path.read_bytes()


def snapshot_key(conn: libvirt.virConnect, spec: GuestSpec, image: images.Image,
                 accel: Accelerator, slot: str | None = None) -> guestcache.Key:
    """``slot``: the snapshot slot when it is not the guest's own name (a pair's clone
    restores its original's snapshot; only its hostname inside differs from its name)."""
    return guestcache.key_for(conn, slot or spec.name, image_digest=image.digest, memory_mib=spec.memory_mib,
                              vcpus=spec.vcpus, accelerator=accel.value, domain_type=accel.domain_type,
                              kernel_cmdline=image.cmdline, image_build=image.build)


@contextlib.contextmanager
def guest(conn: libvirt.virConnect, spec: GuestSpec, image: images.Image, accel: Accelerator,
          run_id: str, run_tag: str, state: Path, shell: remote.Shell | None = None,
          snapshots: str = "use", emulator: str | None = None,
          machine: str | None = None, slot: str | None = None,
          users: Sequence[render.SeedUser] = ()) -> Iterator[Guest]:
    """One guest on the host behind ``conn`` (and ``shell`` for a remote one), on its own
    overlay; destroyed and its files removed on exit. Restored from its cached snapshot
    when one matches (on this machine, the testbed's own image); otherwise booted cold, with
    the reason recorded, and its snapshot saved once it is ready. ``snapshots``: "use", "off"
    (cold, nothing saved), or "renew" (cold, and the snapshot made again). ``emulator`` and
    ``machine``: a variant's QEMU binary and machine type (matrix.variants). ``users``: login
    users the seed asks cloud-init for (none by default; such a guest boots cold, the
    snapshot key does not cover them)."""
    name = f"tb-{run_tag}-{spec.name}"
    state.mkdir(parents=True, exist_ok=True)
    console = state / f"{name}.console.log"
    try:
        console_from = console.stat().st_size
    except OSError:
        console_from = 0
    key, why = None, None
    if snapshots == "off":
        why = "snapshots off"
    elif users:
        why = "seed with login users: not snapshotted"
    elif spec.placement.shapes_saved_state:
        # Memory backing, NUMA policy, CPU model and IO thread objects are fixed when QEMU
        # starts, and the snapshot key does not cover them: such a guest boots as asked.
        why = f"placement with {spec.placement.shapes_saved_state}: not snapshotted"
    elif emulator or machine:
        # The key names the default QEMU and machine; a variant's guests are what is compared,
        # so they boot the way the variant says, every time.
        why = "variant with its own emulator or machine type: not snapshotted"
    elif shell is not None and shell.remote:
        why = "remote host: snapshots are kept on this machine only"
    elif image.kernel is None:
        why = "user image: not snapshotted"
    else:
        try:
            key = snapshot_key(conn, spec, image, accel, slot)
        except libvirt.libvirtError as e:
            why = f"snapshot key unknown: {e.get_error_message()}"
    snap = None
    if key is not None and snapshots == "renew":
        why = "snapshot renewed"
    elif key is not None:
        snap, why = guestcache.lookup(key)
    if snap is not None:
        try:
            with _restored(conn, snap, name, run_id, state, console) as g:
                g.spec, g.shell, g.console_from, g.accelerator = spec, shell, console_from, accel.value
                yield g
            return
        except _RestoreFailed as e:
            why = f"restore from snapshot {key.digest} failed: {e}"  # type: ignore[union-attr]
            log.warning("guest %s: %s; booting cold", name, why)
    with contextlib.ExitStack() as stack:
        local_seed = _seed_iso(render.cloud_init(hostname=spec.name, run_id=run_id,
                                                 instance_id=f"{name}-{run_id}", users=users),
                               state / f"{name}-seed.iso")
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
            **render.placement_params(spec.placement),
            **({"emulator": emulator} if emulator else {}),
            **({"machine": machine} if machine else {})))
        (state / f"{name}.xml").write_text(xml)
        started = time.monotonic()
        dom = stack.enter_context(domain(conn, xml))
        log.info("started guest %s (%s, cold: %s)", name, accel.value, why)
        yield Guest(spec=spec, name=name, dom=dom, agent=Agent(dom, name), console_log=console,
                    boot_started=started, shell=shell, boot="cold", boot_reason=why, run_id=run_id,
                    accelerator=accel.value,
                    console_from=console_from, snapshot_key=key.digest if key else None,
                    save_to=(key, conn, disk, local_seed, state, snapshots == "renew") if key else None)


class _RestoreFailed(Exception):
    pass


@contextlib.contextmanager
def _restored(conn: libvirt.virConnect, snap: guestcache.Snapshot, name: str, run_id: str, state: Path,
              console: Path) -> Iterator[Guest]:
    """A guest restored from ``snap`` under this run's name and a new UUID, writing into its
    own overlay over the snapshot's frozen layer. Raises _RestoreFailed (before yielding)
    when the restore does not succeed, having removed what it made."""
    disk, image = state / f"{name}.qcow2", state / f"{name}.save"
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: disk.unlink(missing_ok=True))
        try:
            _overlay_file(snap.disk, disk)
            xml = guestcache.restore_xml(guestcache.read_image_xml(snap.state), name=name,
                                         uuid=str(uuid_mod.uuid4()), run_id=run_id, disk=str(disk),
                                         seed=str(snap.seed), console_log=str(console))
            (state / f"{name}.xml").write_text(xml)
            # libvirt takes the XML from the image: this restore's own, streamed to it
            # through a FIFO with this guest's XML (guestcache.streamed_image).
            started = time.monotonic()
            with guestcache.streamed_image(snap.state, image, xml):
                dom = stack.enter_context(restored_domain(conn, image, name))
        except (TestbedError, OSError) as e:
            raise _RestoreFailed(str(e)) from None
        done = time.monotonic()
        log.info("restored guest %s from snapshot %s", name, snap.key.digest)
        yield Guest(spec=None, name=name, dom=dom, agent=Agent(dom, name),  # type: ignore[arg-type]
                    console_log=console, boot_started=started, boot="restored",
                    snapshot_key=snap.key.digest, run_id=run_id, restore_s=done - started,
                    steps={"restore call": done - started})


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
    # The MAC is the same for every plug of this NIC in a run: an earlier unplug the guest has
    # not finished yet (a slow PCIe hot-unplug under TCG) would leave two NICs with one MAC
    # and one address in the guest, and a path that works now and then.
    if not _gone(g, mac, timeout):
        raise TestbedError(f"guest {g.name}: an earlier NIC {mac} is still unplugging after {timeout:.0f} s")
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


def _gone(g: Guest, mac: str, timeout: float) -> bool:
    """Wait (at most ``timeout`` s) until no NIC with ``mac`` is left in the running domain."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if not (g.dom.isActive() and mac.lower() in g.dom.XMLDesc(0).lower()):
                return True
        except libvirt.libvirtError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def _unplug(g: Guest, xml: str, mac: str, timeout: float = 30) -> None:
    with contextlib.suppress(libvirt.libvirtError):
        if not g.dom.isActive():
            return
        g.dom.detachDeviceFlags(xml, libvirt.VIR_DOMAIN_AFFECT_LIVE)
        if not _gone(g, mac, timeout):
            log.warning("guest %s: NIC %s still present %ds after unplug", g.name, mac, timeout)


def qemu_pid(g: Guest) -> int | None:
    """The QEMU process of a running domain, from libvirt's pid file."""
    try:
        return int(Path(f"/run/libvirt/qemu/{g.name}.pid").read_text().strip())
    except (OSError, ValueError):
        return None
