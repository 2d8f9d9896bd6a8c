"""A guest whose kernel panics while booting is seen in its console at once, not after the
readiness deadline; a panic from the guest's earlier life (QEMU appends to the log when a
lost guest is booted again) is not taken for this boot's."""
from __future__ import annotations

from testbed.guests.virt import Guest

PANIC = ("[    0.012000] ---[ end Kernel panic - not syncing: IO-APIC + timer doesn't work!  "
         "Boot with apic=debug and send a report.  Then try booting with the 'noapic' option. ]---\n")
BOOT = "[    1.2] Run /sbin/init as init process\n[   13.2] cloud-init-boot[131]: Cloud-init v. 22.4.2 running\n"


def _guest(log, console_from=0) -> Guest:
    return Guest(spec=None, name="tb-0000-g1", dom=None, agent=None, console_log=log,  # type: ignore[arg-type]
                 boot_started=0.0, console_from=console_from)


def _append(log, text: str) -> None:
    with open(log, "a") as f:
        f.write(text)


def test_a_panic_in_this_boot_is_seen(tmp_path):
    log = tmp_path / "console.log"
    log.write_text(BOOT)
    g = _guest(log)
    assert not g._panicked()
    _append(log, PANIC)
    assert g._panicked()


def test_a_panic_before_this_boot_is_not_this_boots(tmp_path):
    log = tmp_path / "console.log"
    log.write_text(BOOT + PANIC)            # the guest's first life ended in a panic
    g = _guest(log, console_from=log.stat().st_size)
    _append(log, BOOT)                      # booted again, fine so far
    assert not g._panicked()
    _append(log, PANIC)
    assert g._panicked()


def test_a_log_started_afresh_is_read_from_its_start(tmp_path):
    log = tmp_path / "console.log"
    log.write_text(BOOT * 40)
    g = _guest(log, console_from=log.stat().st_size)
    log.write_text(PANIC)                   # a restored QEMU's new log, shorter than the offset
    assert g._panicked()


def test_no_console_yet_is_no_panic(tmp_path):
    assert not _guest(tmp_path / "missing.log")._panicked()
