"""ssh options a fleet inventory may give, by allow-list: on ssh's command line
(``ansible_ssh_common_args``, ``ansible_ssh_extra_args``) and in an ssh_config file the
inventory points at (``testbed_ssh_config``, or ``-F`` in those arguments).

Why an allow-list: the options that matter are many and spelled many ways. ssh reads
``-oStrictHostKeyChecking=no``, ``-o "stricthostkeychecking no"``, ``-Co StrictHostKeyChecking=no``
and ``"StrictHostKeyChecking" = no`` alike; a config line may run a command (``ProxyCommand``,
``LocalCommand``, ``KnownHostsCommand``, ``Match exec``), load a library (``PKCS11Provider``),
take host keys from somewhere else (``UserKnownHostsFile``, ``GlobalKnownHostsFile``,
``HostKeyAlias``, ``VerifyHostKeyDNS``) or pull in unchecked files (``Include``). So the
arguments are parsed as ssh's getopt parses them, each keyword is normalised as ssh
normalises it (case, quotes, ``=`` or blanks), and only keywords known to leave host key
checking and the controller alone pass. Everything else is refused, named.

Pure: a refusal is a :class:`SshOptionError` with the option and why; the caller names the
host and the variable.
"""
from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Callable

#: ssh's own option string (OpenSSH 9.x ssh.c): a letter followed by ':' takes an argument
SSH_GETOPT = "1246ab:c:e:fgi:kl:m:no:p:qstvxAB:CD:E:F:GI:J:KL:MNO:P:Q:R:S:TVw:W:XYy"
_TAKES_ARG = {c for i, c in enumerate(SSH_GETOPT) if c != ":" and SSH_GETOPT[i + 1:i + 2] == ":"}
#: flags without an argument that change nothing about trust: IPv4/IPv6 only, compression,
#: quiet, verbose
_FLAGS_OK = set("46Cqv")
#: flags with an argument that are checked like the -o keyword of the same meaning
_FLAG_AS_KEYWORD = {"c": "ciphers", "m": "macs", "l": "user", "p": "port", "J": "proxyjump",
                    "i": "identityfile"}

#: keywords that turn host key checking off or take keys from elsewhere, run a command on the
#: controller, load code into ssh, or pull in files nobody checked: named in the refusal
FORBIDDEN = {
    "stricthostkeychecking": "sets host key checking (the fleet always checks: StrictHostKeyChecking=yes)",
    "userknownhostsfile": "takes host keys from another file (give the fleet's pinned keys as testbed_known_hosts)",
    "globalknownhostsfile": "takes host keys from another file (give the fleet's pinned keys as testbed_known_hosts)",
    "knownhostscommand": "runs a command on the controller to find host keys",
    "hostkeyalias": "checks the host's key under another host's name",
    "verifyhostkeydns": "accepts host keys from DNS",
    "nohostauthenticationforlocalhost": "skips host key checking for localhost",
    "updatehostkeys": "writes keys the host sends into known_hosts",
    "proxycommand": "runs a command on the controller",
    "localcommand": "runs a command on the controller",
    "permitlocalcommand": "lets a command run on the controller",
    "remotecommand": "replaces the command Ansible runs",
    "include": "reads further files nobody checked",
    "pkcs11provider": "loads a library into ssh on the controller",
    "securitykeyprovider": "loads a library into ssh on the controller",
    "controlpath": "points ssh at another connection's socket (Ansible manages its own)",
    "controlmaster": "Ansible manages its own connection sharing",
    "forwardagent": "hands the controller's ssh agent to the host",
    "localforward": "opens a tunnel", "remoteforward": "opens a tunnel", "dynamicforward": "opens a tunnel",
    "tunnel": "opens a tunnel", "tunneldevice": "opens a tunnel", "gatewayports": "opens a tunnel",
    "forwardx11": "forwards X11 to the host", "forwardx11trusted": "forwards X11 to the host",
    "proxyusefdpass": "belongs to ProxyCommand",
}

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?$")
_ALGOS = re.compile(r"^[+^-]?[A-Za-z0-9@.,_-]{1,1024}$")
_WORD = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_INT = re.compile(r"^[0-9]{1,7}$")
_YESNO = ("yes", "no")


class SshOptionError(ValueError):
    """An ssh option a fleet refuses: ``option`` as written, ``why`` in words."""

    def __init__(self, option: str, why: str) -> None:
        self.option, self.why = option, why
        super().__init__(f"{option}: {why}")


def is_host(text: str) -> bool:
    """A host name or an IP address that ssh can only read as one (never as an option)."""
    if not text or text[0] == "-" or not text.isprintable() or any(c.isspace() for c in text):
        return False
    addr = text.strip("[]")
    # Python takes nearly anything as an IPv6 scope (fe80::1%$(id)): an interface name only
    if "%" in addr and not re.fullmatch(r"[0-9A-Fa-f:.]+%[A-Za-z0-9_.-]{1,15}", addr):
        return False
    try:
        ipaddress.ip_address(addr)
        return True
    except ValueError:
        return bool(_HOST.match(text))


def is_user(text: str) -> bool:
    return bool(_NAME.match(text)) and text not in (".", "..")


def _one_of(*values: str) -> Callable[[str], bool]:
    return lambda v: v.lower() in values


#: a path ssh reads as written: ssh splits a value on blanks (UserKnownHostsFile takes a list)
#: and unquotes '...', "..." and backslashes, so a path holding any of them would make ssh
#: read another file than the one checked
_PLAIN_PATH = re.compile(r"[^\s'\"\\]{1,4096}")


def plain_path(v: str) -> bool:
    """A file path ssh reads as exactly this one file."""
    return bool(_PLAIN_PATH.fullmatch(v)) and v.isprintable()


def _path(v: str) -> bool:
    # a file ssh reads on the controller: one plain path (ssh expands ~ and %-tokens)
    return plain_path(v) and v[0] != "-"


def _jump(v: str) -> bool:
    if v.lower() == "none":
        return True
    for hop in v.split(","):
        hop = hop.removeprefix("ssh://")
        user, _, rest = hop.rpartition("@")
        host, port = rest, ""
        if rest.startswith("["):
            host, _, port = rest[1:].partition("]")
            port = port.removeprefix(":")
        elif rest.count(":") == 1:
            host, port = rest.split(":")
        if (user and not is_user(user)) or not is_host(host) or (port and not _port(port)):
            return False
    return True


def _port(v: str) -> bool:
    return v.isdigit() and len(v) <= 5 and 1 <= int(v) <= 65535


#: keyword (lower case) -> check of its value
ALLOWED: dict[str, Callable[[str], bool]] = {
    "addressfamily": _one_of("any", "inet", "inet6"),
    "batchmode": _one_of(*_YESNO),
    "bindaddress": is_host,
    "bindinterface": lambda v: bool(re.match(r"^[A-Za-z0-9_.:@-]{1,15}$", v)) and v[0] != "-",
    "casignaturealgorithms": _ALGOS.match,
    "certificatefile": _path,
    "checkhostip": _one_of(*_YESNO),
    "ciphers": _ALGOS.match,
    "compression": _one_of(*_YESNO),
    "connectionattempts": _INT.match,
    "connecttimeout": _INT.match,
    "controlpersist": lambda v: bool(re.match(r"^(yes|no|[0-9]{1,7}[smhdw]?)$", v.lower())),
    "escapechar": lambda v: v.lower() == "none" or (len(v) <= 2 and v.isprintable() and " " not in v),
    "fingerprinthash": _one_of("md5", "sha256"),
    "gssapiauthentication": _one_of(*_YESNO),
    "hashknownhosts": _one_of(*_YESNO),
    "hostbasedacceptedalgorithms": _ALGOS.match,
    "hostkeyalgorithms": _ALGOS.match,
    "hostname": is_host,
    "identitiesonly": _one_of(*_YESNO),
    "identityfile": _path,
    "ipqos": lambda v: bool(re.match(r"^[A-Za-z0-9 ]{1,40}$", v)),
    "kbdinteractiveauthentication": _one_of(*_YESNO),
    "kexalgorithms": _ALGOS.match,
    "loglevel": _one_of("quiet", "fatal", "error", "info", "verbose", "debug", "debug1", "debug2", "debug3"),
    "macs": _ALGOS.match,
    "numberofpasswordprompts": _INT.match,
    "passwordauthentication": _one_of(*_YESNO),
    "port": _port,
    "preferredauthentications": lambda v: bool(re.match(r"^[a-z0-9,-]{1,200}$", v.lower())),
    "proxyjump": _jump,
    "pubkeyacceptedalgorithms": _ALGOS.match,
    "pubkeyacceptedkeytypes": _ALGOS.match,
    "pubkeyauthentication": _one_of(*_YESNO, "unbound", "host-bound"),
    "rekeylimit": lambda v: bool(re.match(r"^[A-Za-z0-9 ]{1,40}$", v)),
    "requiredrsasize": _INT.match,
    "serveralivecountmax": _INT.match,
    "serveraliveinterval": _INT.match,
    "tcpkeepalive": _one_of(*_YESNO),
    "user": is_user,
    "visualhostkey": _one_of(*_YESNO),
}
#: Match criteria that look at names only, with an argument and without (``exec`` runs a
#: command on the controller: refused)
_MATCH_ARG = {"host", "originalhost", "user", "localuser", "localnetwork", "tagged"}
_MATCH_BARE = {"all", "canonical", "final"}


def _check_match(value: str, where: str) -> None:
    try:
        words = shlex.split(value)
    except ValueError:
        words = []
    k = 0
    while k < len(words):
        crit = words[k].lower().lstrip("!")
        if crit in _MATCH_ARG and k + 1 < len(words):
            k += 2
        elif crit in _MATCH_BARE:
            k += 1
        else:
            break
    if not words or k < len(words):
        raise SshOptionError(where, "Match may only look at names (host, user, ...): "
                                    "'Match exec' runs a command on the controller")


#: keywords whose value is a file ssh reads on the controller: the caller checks each file
#: (a FIFO would hang ssh, a device or a folder is no key)
FILE_KEYWORDS = ("identityfile", "certificatefile")


def check_keyword(keyword: str, value: str, shown: str, files: list[str] | None = None) -> str:
    """One ``keyword value`` pair (from -o or a config line): its normalised keyword, or
    SshOptionError naming ``shown``. The files of :data:`FILE_KEYWORDS` go to ``files``."""
    key = keyword.strip().strip('"').lower()
    if key in FORBIDDEN:
        raise SshOptionError(shown, f"{keyword.strip().strip(chr(34))} {FORBIDDEN[key]}")
    check = ALLOWED.get(key)
    if check is None:
        raise SshOptionError(shown, f"ssh option {keyword.strip()!r} is not one a fleet allows "
                                    f"(the allowed ones are listed in docs/fleet.md)")
    v = value.strip()
    if len(v) >= 2 and v[0] == v[-1] == '"':
        v = v[1:-1]
    if not v or not v.isprintable() or not check(v):
        raise SshOptionError(shown, f"{keyword.strip()}: value {v[:60]!r} is not allowed here")
    if key in FILE_KEYWORDS and files is not None:
        if "%" in v:
            raise SshOptionError(shown, f"{keyword.strip()}: a fleet takes the file's own path, without "
                                        f"%-tokens (so that it can be checked before ssh reads it)")
        files.append(v)
    return key


_KV = re.compile(r"""^\s*("?)([A-Za-z][A-Za-z0-9]*)\1(?:\s*=\s*|\s+)(.*)$""")


def split_keyword(text: str) -> tuple[str, str] | None:
    """ssh's reading of one option: keyword, then blanks or one '=' (with blanks), then the value."""
    m = _KV.match(text)
    return (m[2], m[3]) if m else None


def check_args(text: str, files: list[str] | None = None) -> list[str]:
    """An ``ansible_ssh_common_args``/``ansible_ssh_extra_args`` string: every option parsed
    as ssh's getopt does. Returns the ssh_config files given with ``-F``; the key and
    certificate files named go to ``files`` (both to be checked by the caller). Raises
    SshOptionError."""
    if not text.isprintable():
        raise SshOptionError(text[:40], "holds control characters")
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise SshOptionError(text[:40], f"cannot be split into arguments ({e})") from None
    configs: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        i += 1
        if not w.startswith("-") or w == "-":
            raise SshOptionError(w, "not an ssh option (a word here would be read as the host or "
                                    "the command)")
        if w == "--":
            raise SshOptionError(w, "ends ssh's options: what follows would be read as the host")
        j = 1
        while j < len(w):
            c = w[j]
            if c not in _TAKES_ARG:
                if c not in _FLAGS_OK:
                    raise SshOptionError(f"-{c}", "an ssh flag a fleet does not allow"
                                         + (" (unknown to ssh)" if c not in SSH_GETOPT else ""))
                j += 1
                continue
            arg = w[j + 1:]
            if not arg:
                if i >= len(words):
                    raise SshOptionError(f"-{c}", "is missing its argument")
                arg = words[i]
                i += 1
            if c == "o":
                kv = split_keyword(arg)
                if kv is None:
                    raise SshOptionError(f"-o {arg[:60]}", "not an ssh option (expected Keyword=value)")
                check_keyword(kv[0], kv[1], f"-o {arg[:60]}", files)
            elif c == "F":
                if not _path(arg):
                    raise SshOptionError(f"-F {arg[:60]}", "not a plain file name")
                configs.append(arg)
            elif c in _FLAG_AS_KEYWORD:
                check_keyword(_FLAG_AS_KEYWORD[c], arg, f"-{c} {arg[:60]}", files)
            else:
                raise SshOptionError(f"-{c}", "an ssh flag a fleet does not allow")
            break
    return configs


def check_config(text: str, files: list[str] | None = None) -> None:
    """An ssh_config file's text, line by line. Raises SshOptionError naming ``line N``; the
    key and certificate files named go to ``files``."""
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not line.isprintable():
            raise SshOptionError(f"line {n}", "holds control characters")
        kv = split_keyword(line)
        if kv is None:
            raise SshOptionError(f"line {n}", f"{line[:60]!r} is not an ssh_config line")
        key, value = kv
        where = f"line {n} ({key})"
        if key.lower() == "host":
            if any(p.lstrip("!")[:1] == "-" or not p.isprintable() for p in value.split()):
                raise SshOptionError(where, "a host pattern may not begin with '-'")
            continue
        if key.lower() == "match":
            _check_match(value, where)
            continue
        check_keyword(key, value, where, files)
