"""The boot breakdown's parsers, on output captured from the testbed's guest."""
from pathlib import Path

from testbed.guests import bootprofile as bp

FIX = Path(__file__).parent / "fixtures" / "bootprofile"


def read(name: str) -> str:
    return (FIX / name).read_text()


def test_duration_forms():
    assert bp.duration_s("1min 669ms") == 60.669
    assert bp.duration_s("31.310s") == 31.31
    assert bp.duration_s("882ms") == 0.882
    assert bp.duration_s("1h 2min 3s") == 3723.0
    assert bp.duration_s("nothing") is None


def test_time_finished_and_unfinished():
    t = bp.parse_time("Startup finished in 2.611s (kernel) + 5.123s (initrd) + 1min 2.345s (userspace) "
                      "= 1min 10.079s\ngraphical.target reached after 1min 669ms in userspace\n")
    assert t == {"kernel_s": 2.611, "initrd_s": 5.123, "userspace_s": 62.345, "total_s": 70.079}
    assert bp.parse_time(read("time-unfinished.txt")) == {}


def test_blame_slowest_first():
    rows = bp.parse_blame(read("blame.txt"))
    assert rows[0] == ("cloud-init-local.service", 31.31)
    assert ("dev-vda.device", 19.257) in rows
    assert ("systemd-user-sessions.service", 0.647) == rows[-1]
    assert [s for _, s in rows] == sorted((s for _, s in rows), reverse=True)


def test_critical_chain():
    chain = bp.parse_critical_chain(read("critical-chain.txt"))
    assert chain[0] == {"unit": "graphical.target", "at_s": 60.669, "took_s": None}
    local = next(c for c in chain if c["unit"] == "cloud-init-local.service")
    assert local == {"unit": "cloud-init-local.service", "at_s": 14.603, "took_s": 31.31}
    assert chain[-1]["unit"] == "-.slice"


def test_cloud_init_stages_and_console():
    assert bp.parse_cloud_init_stages(read("cloud-init-analyze-show.txt")) == {
        "init-local": 4.178, "init-network": 2.913, "modules-final": 0.669}
    assert bp.parse_console(read("console.log")) == {"init-local": 50.52, "init": 66.24,
                                                     "modules:final": 90.67, "finished": 92.36}


def test_breakdown_start_up_is_unit_minus_stage():
    b = bp.breakdown(time_text=read("time-unfinished.txt"), blame_text=read("blame.txt"),
                     chain_text=read("critical-chain.txt"), analyze_text=read("cloud-init-analyze-show.txt"),
                     console_text=read("console.log"), top=3)
    by = {s["stage"]: s for s in b["cloud_init"]}
    assert by["init-local"]["startup_s"] == 27.13
    assert by["modules-final"]["startup_s"] == 21.86
    assert "modules-config" not in by          # masked in the image: neither source has it
    assert len(b["top_units"]) == 3
    text = "\n".join(bp.format_breakdown(b))
    assert "boot not finished" in text
    assert "init-local" in text and "27.13 s" in text
    assert "cloud-init-local.service 31.31 s" in text
