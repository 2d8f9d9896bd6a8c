"""Pick the host-side segment for an attachment mode, checking its capability first."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from testbed.errors import CapabilityError
from testbed.hostnet import bridge
from testbed.model import Attachment


@contextlib.contextmanager
def segment(attachment: Attachment, run_tag: str, mtu: int) -> Iterator[object]:
    if attachment is Attachment.BRIDGE:
        with bridge.segment(run_tag, mtu) as seg:
            yield seg
        return
    raise CapabilityError(f"attachment {attachment.value} is not implemented yet")
