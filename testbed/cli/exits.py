"""Which exit statuses each command returns, in its own words: the source of the lines that
end every `testbed COMMAND --help` and of the documentation's table. The statuses themselves
are testbed.errors.ExitStatus; a command lists only those it can return."""
from __future__ import annotations

from testbed.errors import ExitStatus as E

#: what every command can return besides its own list: bad input, an unexpected failure
#: (a command that broke, with what it printed), an interruption
_ALWAYS = ((E.BAD_INPUT, None), (E.INTERRUPTED, None))
_HOST = ((E.MISSING_CAPABILITY, None), (E.HOST_UNAVAILABLE, None))

#: command (as typed after `testbed`) -> (status, its meaning for that command, or None for
#: the status's general meaning), in the order shown
COMMANDS: dict[str, tuple[tuple[E, str | None], ...]] = {
    "": tuple((s, None) for s in E),
    "run": ((E.OK, "every sample succeeded (with --decide-against: the gate passed)"),
            (E.FAILED, "a sample failed (with --decide-against: a cell regressed, broke or "
                       "went missing); samples measured again because the host was busy are "
                       "not failures"),
            *_HOST,
            (E.UNDECIDED, "with --decide-against: the gate could not decide some cell"),
            *_ALWAYS),
    "validate": ((E.OK, "the file is valid (its guests and cells are printed)"), *_ALWAYS),
    "doctor": ((E.OK, "guests can run here (KVM or TCG)"),
               (E.FAILED, "no guest can run on this host: neither KVM nor TCG boots the image's kernel"),
               *_ALWAYS),
    "cleanup": ((E.OK, "nothing is left (or there was nothing to clean up)"),
                (E.FAILED, "some tb- objects are still present after the removal (listed)"),
                *_ALWAYS),
    "image": ((E.OK, "the image is built or was cached"), (E.FAILED, "the build failed"),
              *_HOST, *_ALWAYS),
    "cache": ((E.OK, None), *_ALWAYS),
    "bench": ((E.OK, "the benchmark ran and printed its figures"),
              (E.FAILED, "the benchmark ran but one of its checks failed (printed)"),
              *_HOST, *_ALWAYS),
    "index": ((E.OK, "every run given was indexed"), *_ALWAYS),
    "compare": ((E.OK, "every cell unchanged or improved"),
                (E.FAILED, "a cell regressed, broke (its failure rate rose), was redefined or "
                           "went missing in NEW"),
                (E.BAD_INPUT, "bad input, or the runs were refused as not comparable (their "
                              "environments differ; --force overrides a CPU model or attachment "
                              "mismatch, never TCG against KVM)"),
                (E.UNDECIDED, None),
                (E.INTERRUPTED, None)),
    "history": ((E.OK, "no unacknowledged regression"),
                (E.FAILED, "a confirmed regression of a series, first confirmable within its newest "
                           "7 runs, is not acknowledged (--ack)"),
                *_ALWAYS),
    "report": ((E.OK, "the report was written"), *_ALWAYS),
    "capacity": ((E.OK, "the plan was printed"), *_ALWAYS),
    "export-csv": ((E.OK, "the CSV was written"), *_ALWAYS),
    "scenario": ((E.OK, "the study's table was printed"), (E.FAILED, None), *_HOST, *_ALWAYS),
    "fleet": ((E.OK, None), (E.FAILED, None), (E.MISSING_CAPABILITY, None), (E.SOME_HOSTS_FAILED, None),
              (E.NO_HOST_DONE, None),
              *_ALWAYS),
    "fleet run": ((E.OK, "every host done"), (E.FAILED, "Ansible failed as a whole"),
                  (E.BAD_INPUT, "bad inventory, topology, limit, or a host that turns host key "
                                "checking off; refused before any host is touched"),
                  (E.MISSING_CAPABILITY, "Ansible is not installed (the `fleet` extra)"),
                  (E.SOME_HOSTS_FAILED, None), (E.NO_HOST_DONE, None), (E.INTERRUPTED, None)),
    "fleet report": ((E.OK, "the hosts were reported side by side"), *_ALWAYS),
}


#: any command can meet an error that is none of the others (a tool or daemon that broke)
OTHER_ERROR = "an error that is none of the others (its one line says what was run and what it printed)"


def of(command: str) -> tuple[tuple[E, str], ...]:
    """(status, meaning) for one command, every meaning filled in, in status order. Status 1
    is on every list: besides what the command says of it, any error that is none of the
    others gives it."""
    rows = dict(COMMANDS[command])
    if E.FAILED not in rows:
        rows[E.FAILED] = OTHER_ERROR
    elif rows[E.FAILED] is not None:
        rows[E.FAILED] = f"{rows[E.FAILED]}; or {OTHER_ERROR}"
    return tuple((s, rows[s] or s.meaning) for s in sorted(rows))


def epilog(command: str) -> str:
    """The lines that end the command's --help (kept as they are by the help formatter)."""
    rows = of(command)
    width = max(len(str(int(s))) for s, _ in rows)
    return "exit statuses:\n" + "\n".join(f"  {int(s):<{width}}  {words}" for s, words in rows)


def commands_returning(status: E) -> tuple[str, ...]:
    return tuple(c for c, rows in COMMANDS.items() if c and any(s == status for s, _ in rows))


def markdown_table() -> str:
    """The one table of exit statuses, for the documentation (built from ExitStatus and
    COMMANDS, so it cannot disagree with the code or with --help)."""
    out = ["| status | meaning | returned by |", "|---|---|---|"]
    commands = {c for c in COMMANDS if c}
    for s in E:
        users = commands_returning(s)
        every = s == E.FAILED or set(users) == commands
        who = "every command" if every else ", ".join(f"`{c}`" for c in users)
        out.append(f"| {int(s)} | {s.meaning.replace('|', '/')} | {who} |")
    return "\n".join(out) + "\n"
