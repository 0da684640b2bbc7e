"""pkghelpers.py — what the install and packaging suites share (test_docs, test_service,
test_wheel, test_package): the paths ctest hands them, attnstat's version as include/attnstat.h
writes it, running a command with a clear failure, a stand-in for systemd's notification socket,
starting attnstatd and waiting for conditions with generous deadlines (never a timing margin),
checking what pkg_pusher.py reports; an ELF file's section names; what a systemd unit and its
drop-ins let through over IP.
Standard library only.
"""
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("ATTNSTAT_SOURCE_DIR") or os.path.dirname(HERE)
BUILD = os.environ.get("ATTNSTAT_BUILD_DIR", "")
DEADLINE_S = 120  # how long a condition is waited for before a test gives up


def skip(why):
    print("SKIP: %s" % why)
    sys.exit(77)


def version_line(program):
    """The pattern of `PROGRAM --version` for a program linked with libattnstat."""
    v = re.escape(header_version())
    return r"^%s %s \(libattnstat %s(\+cuda)?\)$" % (re.escape(program), v, v)


def header_version():
    """ATTNSTAT_VERSION of include/attnstat.h: the one version of attnstat."""
    with open(os.path.join(SOURCE, "include", "attnstat.h")) as f:
        m = re.search(r'^#define ATTNSTAT_VERSION "([0-9]+\.[0-9]+\.[0-9]+)"$', f.read(), re.M)
    assert m, "include/attnstat.h has no ATTNSTAT_VERSION line"
    return m.group(1)


def need_env(*names):
    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        skip("run by ctest, which sets %s" % ", ".join(missing))
    return [os.environ[n] for n in names]


def run(cmd, check=True, timeout=600, **kw):
    """Runs cmd; returns the CompletedProcess (text). With check, a failure raises AssertionError
    with the command and its output."""
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    p = subprocess.run(cmd, universal_newlines=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError("%s exited %d\n--- stdout\n%s\n--- stderr\n%s"
                             % (" ".join(map(str, cmd)), p.returncode, p.stdout, p.stderr))
    return p


def wait_for(what, cond, deadline_s=DEADLINE_S, proc=None):
    """Polls cond() until it is true; fails naming what after deadline_s, or at once when proc
    (a Popen) has exited."""
    end = time.monotonic() + deadline_s
    while True:
        v = cond()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise AssertionError("waiting for %s: the process exited with %d"
                                 % (what, proc.returncode))
        if time.monotonic() > end:
            raise AssertionError("waiting for %s: not after %d s" % (what, deadline_s))
        time.sleep(0.05)


def connectable(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class NotifySocket(object):
    """What systemd listens on for a Type=notify service: a datagram socket; NOTIFY_SOCKET names
    it (a path, or '@name' in the abstract namespace)."""

    def __init__(self, abstract=False, mode=0o600):
        self.dir = None
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            self.name = "@attnstat-test-%d-%d" % (os.getpid(), random.getrandbits(48))
            self.sock.bind("\0" + self.name[1:])
        else:
            self.dir = tempfile.mkdtemp(prefix="attnstat-notify-")
            os.chmod(self.dir, 0o755)
            self.name = os.path.join(self.dir, "notify")
            self.sock.bind(self.name)
            os.chmod(self.name, mode)
        self.sock.settimeout(0.2)
        self.messages = []

    def wait(self, key, proc=None, deadline_s=DEADLINE_S):
        """The first message with the line key (e.g. 'READY=1'), as a dict of its lines."""
        def got():
            for m in self.messages:
                if key in m.split("\n"):
                    return dict(l.split("=", 1) for l in m.split("\n") if "=" in l)
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except socket.timeout:
                pass
            return None
        return wait_for("%s on %s" % (key, self.name), got, deadline_s, proc)

    def close(self):
        self.sock.close()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class Daemon(object):
    """An attnstatd process (cmd: its argv), stderr in a log file; stopped by SIGTERM."""

    def __init__(self, cmd, env=None, log_dir=None, preexec_fn=None):
        self.log_path = os.path.join(log_dir or tempfile.gettempdir(),
                                     "attnstatd-%d-%d.log" % (os.getpid(), random.getrandbits(32)))
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=preexec_fn)

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self, deadline_s=DEADLINE_S):
        """SIGTERM, then the exit status (SIGKILL and a failure past the deadline)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(deadline_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("attnstatd did not stop within %d s of SIGTERM:\n%s"
                                     % (deadline_s, self.log_text()))
        self.log.close()
        return self.proc.returncode

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self.log.closed:
            self.log.close()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


def cli_json(cli, *args, **kw):
    """attnstat ARGS --format json: its lines, each an object."""
    out = run([cli] + list(args) + ["--format", "json"], **kw).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.strip()]
    return rows


def check_results(tc, out, pushes):
    """Asserts (on unittest.TestCase tc) that pkg_pusher.py's output out says every one of its
    pushes was sent, flushed and answered with per-head values equal to its float64 reference."""
    tc.assertTrue(out["pushed"] and out["flushed"], out)
    tc.assertEqual(sorted(out["results"], key=int), [str(s) for s in range(pushes)])
    for step, heads in out["results"].items():
        ref = out["reference"][step]
        tc.assertEqual(sorted(h["head"] for h in heads), list(range(len(ref))))
        for h in heads:
            r = ref[h["head"]]
            for key in ("entropy_mean", "max_logit"):
                tc.assertAlmostEqual(h[key], r[key], delta=1e-6 * max(1.0, abs(r[key])),
                                     msg="step %s head %d %s" % (step, h["head"], key))


def elf_sections(path):
    """The section names of an ELF64 little-endian file (a stripped program keeps them), read from
    its section header table."""
    import struct
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "%s: not ELF64 LE" % path
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i):
        name, _type, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", data, shoff + i * shentsize)
        return name, offset, size

    _, stroff, strsize = header(shstrndx)
    strtab = data[stroff:stroff + strsize]
    names = []
    for i in range(shnum):
        name = header(i)[0]
        names.append(strtab[name:strtab.index(b"\0", name)].decode())
    return names


# What systemd.resource-control(5) says of IPAddressAllow= and IPAddressDeny=: lists of address
# prefixes or the words below, merged over the unit and its drop-ins, an empty assignment clearing
# the list; a packet whose address the allow list matches passes, else one the deny list matches
# is dropped, else it passes.
IP_WORDS = {"any": ["0.0.0.0/0", "::/0"], "localhost": ["127.0.0.0/8", "::1/128"],
            "link-local": ["169.254.0.0/16", "fe80::/64"], "multicast": ["224.0.0.0/4", "ff00::/8"]}


def unit_service_lists(texts, keys):
    """{key: [values]} of the [Service] section of a unit and its drop-ins (texts, in the order
    systemd reads them), for the list-valued keys given: assignments add their space-separated
    words, an empty assignment clears the list."""
    out = {k: [] for k in keys}
    for text in texts:
        section = None
        for line in text.splitlines():
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line
                continue
            key, _, value = line.partition("=")
            if section == "[Service]" and key.strip() in out:
                words = value.split()
                out[key.strip()] = out[key.strip()] + words if words else []
    return out


def ip_allowed(texts, address):
    """Whether systemd lets the service exchange packets with address (unit and drop-ins: texts)."""
    import ipaddress
    lists = unit_service_lists(texts, ("IPAddressAllow", "IPAddressDeny"))
    addr = ipaddress.ip_address(address)

    def matches(words):
        for w in words:
            for net in IP_WORDS.get(w, [w]):
                net = ipaddress.ip_network(net, strict=False)
                if net.version == addr.version and addr in net:
                    return True
        return False

    return matches(lists["IPAddressAllow"]) or not matches(lists["IPAddressDeny"])
