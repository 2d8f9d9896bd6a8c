"""The guest agent's file check that the readiness wait uses (no libvirt: the agent's
command is replaced by its answers as libvirt reports them)."""
import pytest

from testbed.errors import GuestError
from testbed.guests.guest import Agent

MISSING = ("guest g1: agent guest-file-open failed: internal error: unable to execute QEMU agent command "
           "'guest-file-open': failed to open file '/var/lib/cloud/instance/boot-finished' (mode: 'r'): "
           "No such file or directory")
DISABLED = ("guest g1: agent guest-file-open failed: internal error: unable to execute QEMU agent command "
            "'guest-file-open': The command guest-file-open has been disabled for this instance")
GONE = "guest g1: agent guest-file-open failed: Guest agent is not responding: QEMU guest agent is not connected"


class Answers(Agent):
    def __init__(self, open_error: str | None) -> None:
        super().__init__(dom=None, name="g1")
        self.open_error, self.calls = open_error, []

    def command(self, execute, arguments=None, timeout=10):
        self.calls.append(execute)
        if execute == "guest-file-open" and self.open_error:
            raise GuestError(self.open_error)
        return 7 if execute == "guest-file-open" else {}


@pytest.mark.parametrize(("error", "expected"), [(None, True), (MISSING, False), (DISABLED, None), (GONE, None)])
def test_exists_opens_the_file_and_tells_missing_from_refused(error, expected):
    a = Answers(error)
    assert a.exists("/var/lib/cloud/instance/boot-finished") is expected
    # an opened file is closed again; nothing else is asked (no process in the guest)
    assert a.calls == (["guest-file-open", "guest-file-close"] if error is None else ["guest-file-open"])
