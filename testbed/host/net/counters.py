"""A device's byte and packet counters (/sys/class/net/<dev>/statistics): what the host
layer reads off a link, and the wire cross-check's second source (testbed.measure.crosscheck)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Wire:
    """Counters of one device, as /sys/class/net/<dev>/statistics has them."""

    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int

    def __sub__(self, other: Wire) -> Wire:
        return Wire(self.rx_bytes - other.rx_bytes, self.tx_bytes - other.tx_bytes,
                    self.rx_packets - other.rx_packets, self.tx_packets - other.tx_packets)

    def towards(self, guest_sends_as_rx: bool) -> tuple[int, int]:
        """(bytes, packets) the device delivered towards its endpoint. A host-side tap
        counts what its guest sends as rx (QEMU writes into it) and what it delivers as tx;
        a macvtap, or an endpoint's own device, the other way round."""
        if guest_sends_as_rx:
            return self.tx_bytes, self.tx_packets
        return self.rx_bytes, self.rx_packets

    def both(self) -> tuple[int, int]:
        return self.rx_bytes + self.tx_bytes, self.rx_packets + self.tx_packets


__all__ = ["Wire"]
