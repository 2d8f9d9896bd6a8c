"""The results disk: the stated estimate of what a matrix writes, the refusal that states
it, and whole-or-nothing writes."""
from __future__ import annotations

import pytest

from testbed.host import diskspace
from testbed.topology.model import Attachment, Backend, Cell, Profile


def cells(n: int, connections: int = 1) -> list[Cell]:
    p = Profile("tcp_stream", message_size=16384, duration_s=1)
    return [Cell(Attachment("netns-veth"), Backend.QEMU, 1500, connections, p) for _ in range(n)]


def test_the_estimate_counts_samples_clients_and_run_json():
    est = diskspace.estimate(cells(3, connections=2), warmup=1, max_samples=4)
    assert (est.samples, est.clients, est.cells) == (15, 30, 3)
    assert est.bytes == (15 * diskspace.SAMPLE_LINE_BYTES + 30 * diskspace.RAW_BYTES_PER_CLIENT
                         + 2 * 3 * diskspace.RUN_JSON_BYTES_PER_CELL + diskspace.FIXED_BYTES)
    assert "15 samples x 8 KiB + 30 client outputs x 32 KiB" in est.explain()


def test_a_run_that_does_not_fit_is_refused_in_one_line_with_the_estimate(tmp_path):
    est = diskspace.Estimate(samples=10**9, clients=10**9, cells=1)
    with pytest.raises(diskspace.DiskFull) as e:
        diskspace.require(tmp_path / "not-yet" / "results", est)
    msg = str(e.value)
    assert e.value.exit_status == 4 and "\n" not in msg
    assert "not enough space" in msg and "1000000000 samples" in msg and f"free on {tmp_path}" in msg


def test_whole_or_nothing_writes(tmp_path):
    p = tmp_path / "out.txt"
    diskspace.write_file(p, "complete\n")
    assert p.read_text() == "complete\n" and [x.name for x in tmp_path.iterdir()] == ["out.txt"]
    import os
    fd = os.open(tmp_path / "s.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    diskspace.append_line(fd, tmp_path / "s.jsonl", '{"a": 1}\n')
    os.close(fd)
    assert (tmp_path / "s.jsonl").read_text() == '{"a": 1}\n'


def test_a_snapshot_that_would_not_fit_in_the_cache_says_why(tmp_path):
    assert diskspace.snapshot_shortfall(1, 0, tmp_path) is None
    why = diskspace.snapshot_shortfall(10**9, 5 * 2**20, tmp_path)
    assert why.startswith("the snapshot needs about ") and "memory 1000000000 MiB + disk overlay 5.0 MiB" in why
    assert f"free on {tmp_path}" in why
