#!/usr/bin/env python3
"""test_package.py — the Debian packages, built from this tree and installed on this machine.

Built (`cmake --build BUILD --target package`: CPack DEB) and inspected, everywhere:
  attnstat, libattnstat0, libattnstat-dev, python3-attnstat: their files (binaries, soname
  library and its link, header, pkg-config and CMake files, manual pages, bash completion, unit,
  sysusers.d and tmpfiles.d entries, /etc/attnstat/attnstatd.conf, the Python package), control
  fields (dependencies, conffiles, shlibs, the ldconfig trigger, the configured Maintainer,
  Installed-Size against the files), maintainer scripts that sh accepts, each package's copyright
  file and changelog.Debian.gz, the packaged unit's ExecStart=;
  - lintian: no error (its warnings printed; skipped, saying so, without lintian);
  - the CLI and attnstat-synth carry no CUDA fatbin and none of the kernels' code (attnstatd and
    libattnstat, which run the kernels, do: the check's own control);
  - the packaged unit and its example drop-in pass `systemd-analyze verify`; without the drop-in
    the unit lets the metrics port be scraped from other hosts and alert_exec webhooks out, over
    IPv4 and IPv6; with it, only this node and the hosts it lists.
Installed with dpkg, where this process is root (CI) and none of them is installed already (a real
installation is never replaced; ATTNSTAT_TEST_NO_INSTALL=1 opts out), then purged at the end:
  - the user and group attnstat and /var/lib/attnstat, /run/attnstat (postinst, through
    systemd-sysusers and systemd-tmpfiles, or useradd where those are absent);
  - the installed attnstatd, attnstat and attnstat-synth answer --version; the manual pages are
    found by man and render cleanly; the installed bash completion completes;
  - `systemd-analyze verify` accepts the installed unit (and `systemd-analyze security` is
    printed);
  - the installed daemon started as the service would (user attnstat, its config file, its
    umask), without systemd since PID 1 is not systemd here (when it is, the service postinst
    started is used): READY=1 on NOTIFY_SOCKET; `attnstat status` shows both versions; Debian's
    python3 with python3-attnstat (libattnstat0 found by its soname) pushes and the samples are
    stored; a user in the group attnstat may connect and read the history, one outside it may not;
  - a C program builds against libattnstat-dev through pkg-config and through find_package;
  - dpkg --purge removes the files, the config and the history.
When the installing part cannot run, it says so ("NOT TESTED") and the inspection still counts.
Run by ctest (test_package); exits 77 when run otherwise or without dpkg-deb.
"""
import email.utils
import grp
import gzip
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pkghelpers as ph  # noqa: E402

(BUILD,) = ph.need_env("ATTNSTAT_BUILD_DIR")
V = ph.header_version()
MAJOR = V.split(".")[0]
PKGS = ["attnstat", "libattnstat" + MAJOR, "libattnstat-dev", "python3-attnstat"]
if not shutil.which("dpkg-deb"):
    ph.skip("no dpkg-deb: not a Debian system")

DEBS = {}


def build_packages():
    if DEBS:
        return DEBS
    ph.run(["cmake", "--build", BUILD, "--target", "package"], timeout=900)
    out = os.path.join(BUILD, "packages")
    for name in PKGS:
        found = [f for f in os.listdir(out)
                 if f.startswith("%s_%s-" % (name, V)) and f.endswith(".deb")]
        assert len(found) == 1, "%s: %s" % (name, found)
        DEBS[name] = os.path.join(out, found[0])
    return DEBS


def contents(deb):
    """{path: (mode string, link target or None, size)} of a .deb's files."""
    out = {}
    for line in ph.run(["dpkg-deb", "-c", deb]).stdout.splitlines():
        fields = line.split(None, 5)
        name = fields[5]
        target = None
        if " -> " in name:
            name, target = name.split(" -> ", 1)
        out[name[1:].rstrip("/") or "/"] = (fields[0], target, int(fields[2]))
    return out


def field(deb, name):
    return ph.run(["dpkg-deb", "-f", deb, name]).stdout.strip()


def control_file(deb, name):
    p = subprocess.run("dpkg-deb --ctrl-tarfile '%s' | tar -xO './%s'" % (deb, name), shell=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    return p.stdout if p.returncode == 0 else None


def cache_value(name):
    """A setting of the build tree's CMakeCache.txt, or None."""
    with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
        m = re.search(r"(?m)^%s:[A-Z]+=(.*)$" % re.escape(name), f.read())
    return m.group(1) if m else None


def read(path):
    with open(path) as f:
        return f.read()


def libdir_of(files):
    libs = [p for p in files if re.search(r"/libattnstat\.so\.%s$" % re.escape(V), p)]
    assert len(libs) == 1, libs
    return os.path.dirname(libs[0])


class Built(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.debs = build_packages()

    def test_tools_package(self):
        files = contents(self.debs["attnstat"])
        for p in ("/usr/bin/attnstatd", "/usr/bin/attnstat", "/usr/bin/attnstat-synth",
                  "/usr/lib/systemd/system/attnstatd.service", "/usr/lib/sysusers.d/attnstat.conf",
                  "/usr/lib/tmpfiles.d/attnstat.conf", "/etc/attnstat/attnstatd.conf",
                  "/usr/share/man/man8/attnstatd.8.gz", "/usr/share/man/man1/attnstat.1.gz",
                  "/usr/share/man/man1/attnstat-synth.1.gz",
                  "/usr/share/bash-completion/completions/attnstat",
                  "/usr/share/bash-completion/completions/attnstatd",
                  "/usr/share/doc/attnstat/README.md",
                  "/usr/share/doc/attnstat/examples/attnstatd.service.d/ip-allowlist.conf"):
            self.assertIn(p, files)
        for p in ("/usr/bin/attnstatd", "/usr/bin/attnstat"):
            self.assertEqual(files[p][0], "-rwxr-xr-x", p)
        self.assertFalse([p for p in files if "libattnstat" in p or "/python3" in p])
        self.assertEqual(control_file(self.debs["attnstat"], "conffiles").split(),
                         ["/etc/attnstat/attnstatd.conf"])
        deps = field(self.debs["attnstat"], "Depends")
        for d in ("libuv1", "libsqlite3-0", "libprotobuf-c1", "procps"):
            self.assertIn(d, deps)
        for script in ("postinst", "prerm", "postrm"):
            text = control_file(self.debs["attnstat"], script)
            self.assertTrue(text, script)
            p = subprocess.run(["sh", "-n"], input=text, universal_newlines=True)
            self.assertEqual(p.returncode, 0, script)

    def test_packaged_unit(self):
        with tempfile.TemporaryDirectory() as d:
            ph.run(["dpkg-deb", "-x", self.debs["attnstat"], d])
            with open(os.path.join(d, "usr/lib/systemd/system/attnstatd.service")) as f:
                unit = f.read()
            with open(os.path.join(d, "etc/attnstat/attnstatd.conf")) as f:
                conf = f.read()
        self.assertIn("\nExecStart=/usr/bin/attnstatd --config /etc/attnstat/attnstatd.conf\n",
                      unit)
        self.assertIn("\nUser=attnstat\n", unit)
        self.assertIn("\nallow_group = attnstat\n", conf)

    def test_library_packages(self):
        lib = contents(self.debs["libattnstat" + MAJOR])
        libdir = libdir_of(lib)
        self.assertEqual(lib[libdir + "/libattnstat.so." + MAJOR][1], "libattnstat.so." + V)
        self.assertRegex(control_file(self.debs["libattnstat" + MAJOR], "shlibs"),
                         r"^libattnstat %s libattnstat%s \(>= %s" % (MAJOR, MAJOR, re.escape(V)))
        dev = contents(self.debs["libattnstat-dev"])
        for p in ("/usr/include/attnstat.h", libdir + "/pkgconfig/attnstat.pc",
                  libdir + "/cmake/attnstat/attnstatConfig.cmake",
                  libdir + "/cmake/attnstat/attnstatConfigVersion.cmake",
                  libdir + "/cmake/attnstat/attnstatTargets.cmake"):
            self.assertIn(p, dev)
        self.assertEqual(dev[libdir + "/libattnstat.so"][1], "libattnstat.so." + MAJOR)
        self.assertIn("libattnstat%s (= %s-" % (MAJOR, V),
                      field(self.debs["libattnstat-dev"], "Depends"))
        # The loader's cache through dpkg's ldconfig trigger, not maintainer scripts.
        lib_deb = self.debs["libattnstat" + MAJOR]
        self.assertIn("activate-noawait ldconfig",
                      (control_file(lib_deb, "triggers") or "").splitlines())
        self.assertEqual([control_file(lib_deb, s) for s in ("postinst", "postrm")], [None, None])

    def test_python_package(self):
        deb = self.debs["python3-attnstat"]
        files = contents(deb)
        base = "/usr/lib/python3/dist-packages/attnstat/"
        for p in ("__init__.py", "_lib.py", "_version.py", "torch/__init__.py"):
            self.assertIn(base + p, files)
        self.assertFalse([p for p in files if p.endswith((".so", ".pyc"))])
        self.assertEqual(field(deb, "Architecture"), "all")
        self.assertIn("libattnstat" + MAJOR, field(deb, "Depends"))


class Debian(unittest.TestCase):
    """What a Debian maintainer asks of the packages beyond their files."""

    @classmethod
    def setUpClass(cls):
        cls.debs = build_packages()

    def test_lintian_reports_no_error(self):
        if not shutil.which("lintian"):
            self.skipTest("NOT TESTED: lintian is not installed (Debian: apt-get install lintian)")
        # --fail-on error: the exit status says whether lintian found an error, whatever its output
        # looks like; the lines are checked as well, and printed for the record.
        p = ph.run(["lintian", "--no-cfg", "--fail-on", "error"] + [self.debs[n] for n in PKGS],
                   check=False)
        tags = [l for l in p.stdout.splitlines() if re.match(r"^[A-Z]: ", l)]
        print("lintian %s: %d error(s), %d warning(s)%s"
              % (ph.run(["lintian", "--version"]).stdout.split()[-1],
                 sum(t.startswith("E: ") for t in tags), sum(t.startswith("W: ") for t in tags),
                 "".join("\n  " + t for t in tags)))
        self.assertEqual(([t for t in tags if t.startswith("E: ")], p.returncode), ([], 0),
                         p.stdout + p.stderr)

    def test_maintainer_copyright_and_changelog(self):
        want = cache_value("ATTNSTAT_DEB_MAINTAINER")
        self.assertRegex(want, r"^[^<>@]+ <[^<>@ ]+@[^<>@ ]+\.[^<>@ ]+>$")
        self.assertNotRegex(want, r"@localhost")
        with open(os.path.join(ph.SOURCE, "deploy", "deb", "copyright")) as f:
            copyright_src = f.read()
        self.assertTrue(copyright_src.startswith(
            "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"))
        # The licence that Files: * names is a paragraph of its own, with its text.
        lic = re.search(r"(?m)^Files: \*\nCopyright: \S.*\nLicense: (\S+)$", copyright_src)
        self.assertTrue(lic, copyright_src)
        self.assertRegex(copyright_src, r"(?m)^License: %s\n( \S.*\n)+" % re.escape(lic.group(1)))
        with tempfile.TemporaryDirectory() as d:
            for name in PKGS:
                deb = self.debs[name]
                self.assertEqual((field(deb, "Maintainer"), field(deb, "Source") or name),
                                 (want, "attnstat"), name)
                ph.run(["dpkg-deb", "-x", deb, os.path.join(d, name)])
                doc = os.path.join(d, name, "usr", "share", "doc", name)
                self.assertEqual(read(os.path.join(doc, "copyright")), copyright_src, name)
                gz = os.path.join(doc, "changelog.Debian.gz")
                with open(gz, "rb") as f:
                    head = f.read(10)
                # gzip -9n: no file name, no time stamp (the same bytes every build), best.
                self.assertEqual((head[:3], head[3] & 0x08, head[4:8], head[8]),
                                 (b"\x1f\x8b\x08", 0, b"\0\0\0\0", 2), name)
                with gzip.open(gz, "rt") as f:
                    log = f.read()
                self.assertEqual(log.splitlines()[0], "attnstat (%s) unstable; urgency=medium"
                                 % field(deb, "Version"), name)
                sig = re.search(r"(?m)^ -- (.+)  (\w{3}, \d{2} \w{3} \d{4} [\d:]{8} \+0000)$", log)
                self.assertTrue(sig, log)
                self.assertEqual(sig.group(1), want)
                self.assertIsNotNone(email.utils.parsedate_to_datetime(sig.group(2)))

    def test_installed_size_counts_each_file_once(self):
        """Installed-Size (KiB) as dpkg-gencontrol counts it: each regular file once, rounded up;
        each link and directory 1 KiB (CPack alone counted libattnstat0's soname link as the
        library itself)."""
        for name in PKGS:
            deb = self.debs[name]
            files = contents(deb)
            regular = sum((size + 1023) // 1024 for mode, _, size in files.values()
                          if mode.startswith("-"))
            others = sum(1 for mode, _, _ in files.values() if not mode.startswith("-"))
            size = int(field(deb, "Installed-Size"))
            print("%s: Installed-Size %d KiB (%s)" % (name, size, os.path.basename(deb)))
            self.assertGreaterEqual(size, regular, name)
            self.assertLessEqual(size, regular + others + 1, name)

    def test_cli_and_synth_carry_no_gpu_code(self):
        """The CLI and attnstat-synth never compute: no CUDA fatbin, none of the kernels. attnstatd
        and libattnstat (local mode) run the kernels, and show that the checks see them."""
        fatbin = {".nv_fatbin", ".nvFatBinSegment", "__nv_relfatbin"}
        built = dict(zip(("attnstat", "attnstat-synth", "attnstatd"),
                         ph.need_env("ATTNSTAT_CLI", "ATTNSTAT_SYNTH", "ATTNSTAT_DAEMON")))
        cuda = "+cuda" in ph.run([built["attnstat"], "--version"]).stdout
        with tempfile.TemporaryDirectory() as d:
            for name in ("attnstat", "libattnstat" + MAJOR):
                ph.run(["dpkg-deb", "-x", self.debs[name], d])
            lib = os.path.join(d, libdir_of(contents(self.debs["libattnstat" + MAJOR]))[1:],
                               "libattnstat.so." + V)
            binaries = {b: os.path.join(d, "usr", "bin", b)
                        for b in ("attnstat", "attnstat-synth", "attnstatd")}
            for b in ("attnstat", "attnstat-synth"):
                self.assertEqual(fatbin & set(ph.elf_sections(binaries[b])), set(), b)
            for what, path in (("attnstatd", binaries["attnstatd"]), ("libattnstat", lib)):
                self.assertEqual(bool(fatbin & set(ph.elf_sections(path))), cuda, what)
            print("packaged sizes (stripped): %s; libattnstat.so.%s %d bytes%s"
                  % (", ".join("%s %d bytes" % (b, os.path.getsize(p))
                               for b, p in sorted(binaries.items())), V, os.path.getsize(lib),
                     "" if cuda else " (this build has no CUDA: no fatbin anywhere)"))
        if not shutil.which("nm"):
            self.skipTest("NOT TESTED: the kernels' symbols: no nm (Debian: binutils)")
        # The build tree's programs keep their symbols: the kernels (prefix stats_) are not linked.
        def kernel_symbols(path):
            out = ph.run(["nm", "--defined-only", path]).stdout
            return sorted(set(re.findall(r"(?m) [TtDdRrBb] (stats_\w+)$", out)))
        for b in ("attnstat", "attnstat-synth"):
            self.assertEqual(kernel_symbols(built[b]), [], b)
        daemon = kernel_symbols(built["attnstatd"])
        self.assertTrue([n for n in daemon if n.startswith("stats_cpu")], daemon)
        self.assertEqual(any(n.startswith("stats_cuda") for n in daemon), cuda, daemon)

    def test_unit_network_and_its_dropin(self):
        """The documented remote scrape and alert_exec webhooks pass the packaged unit; the example
        drop-in narrows IP to this node and the hosts it lists; systemd accepts both."""
        with tempfile.TemporaryDirectory() as d:
            ph.run(["dpkg-deb", "-x", self.debs["attnstat"], d])
            unit = read(os.path.join(d, "usr/lib/systemd/system/attnstatd.service"))
            named = re.search(
                r"/usr/share/doc/attnstat/examples/attnstatd\.service\.d/[\w.-]+\.conf", unit)
            self.assertTrue(named, "the unit names its example drop-in")
            dropin = read(os.path.join(d, named.group(0)[1:]))
            families = ph.unit_service_lists([unit], ["RestrictAddressFamilies"])
            self.assertLessEqual({"AF_UNIX", "AF_INET", "AF_INET6"},
                                 set(families["RestrictAddressFamilies"]))
            # A Prometheus server elsewhere, a webhook's gateway (documentation addresses).
            remote = ["198.51.100.7", "2001:db8:1::7", "203.0.113.9"]
            for a in ["127.0.0.1", "::1"] + remote:
                self.assertTrue(ph.ip_allowed([unit], a), a)
            listed = [w for w in ph.unit_service_lists([dropin], ["IPAddressAllow"])
                      ["IPAddressAllow"] if w not in ph.IP_WORDS]
            self.assertTrue(listed, dropin)
            for a in ["127.0.0.1", "::1"] + listed:
                self.assertTrue(ph.ip_allowed([unit, dropin], a), a)
            for a in remote:
                self.assertFalse(ph.ip_allowed([unit, dropin], a), a)

            if not shutil.which("systemd-analyze"):
                self.skipTest("NOT TESTED: systemd-analyze verify: no systemd-analyze (Debian: "
                              "systemd)")
            # The unit as packaged, its ExecStart= naming the extracted daemon (not installed here).
            vdir = os.path.join(d, "verify")
            os.makedirs(os.path.join(vdir, "attnstatd.service.d"))
            path = os.path.join(vdir, "attnstatd.service")
            with open(path, "w") as f:
                f.write(unit.replace("\nExecStart=/usr/bin/attnstatd ",
                                     "\nExecStart=%s/usr/bin/attnstatd " % d))

            def verify():
                p = ph.run(["systemd-analyze", "verify", "--man=no", path], check=False)
                return p.returncode, p.stdout + p.stderr

            self.assertEqual(verify(), (0, ""))
            # systemd reads the drop-ins beside the unit: one it cannot use is reported.
            control = os.path.join(vdir, "attnstatd.service.d", "zz-control.conf")
            with open(control, "w") as f:
                f.write("[Service]\nIPAddressAllow=not-an-address\n")
            self.assertIn("zz-control.conf", verify()[1])
            os.unlink(control)
            with open(os.path.join(vdir, "attnstatd.service.d", "ip-allowlist.conf"), "w") as f:
                f.write(dropin)
            self.assertEqual(verify(), (0, ""))


def install_blocker():
    """Why the packages cannot be installed here, or None."""
    if os.environ.get("ATTNSTAT_TEST_NO_INSTALL") == "1":
        return "ATTNSTAT_TEST_NO_INSTALL=1"
    if os.geteuid() != 0:
        return "needs root (dpkg -i)"
    if not shutil.which("dpkg"):
        return "no dpkg"
    for name in PKGS:
        p = ph.run(["dpkg-query", "-W", "-f=${Status}", name], check=False)
        if "installed" in p.stdout and "not-installed" not in p.stdout:
            return "%s is installed on this machine already (not replaced by a test)" % name
    return None


def man_excluded():
    d = "/etc/dpkg/dpkg.cfg.d"
    for f in os.listdir(d) if os.path.isdir(d) else []:
        with open(os.path.join(d, f)) as fh:
            if re.search(r"(?m)^path-exclude=?\s*/usr/share/man", fh.read()):
                return True
    return False


@unittest.skipIf(install_blocker(), "NOT TESTED: installing the packages: %s" % install_blocker())
class Installed(unittest.TestCase):
    SOCK = "/run/attnstat/attnstatd.sock"
    DB = "/var/lib/attnstat/attnstat.db"

    @classmethod
    def setUpClass(cls):
        cls.debs = build_packages()
        cls.tmp = tempfile.mkdtemp(prefix="attnstat-pkg-")
        os.chmod(cls.tmp, 0o755)
        cls.pusher = os.path.join(cls.tmp, "pkg_pusher.py")  # where other users can read it
        shutil.copy(os.path.join(ph.HERE, "pkg_pusher.py"), cls.pusher)
        os.chmod(cls.pusher, 0o644)
        cls.daemon = cls.notify = None
        try:
            ph.run(["dpkg", "-i"] + [cls.debs[n] for n in PKGS])
            cls.start_service()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def start_service(cls):
        if os.path.isdir("/run/systemd/system"):  # PID 1 is systemd: postinst started it
            active = ["systemctl", "is-active", "--quiet", "attnstatd.service"]
            ph.wait_for("attnstatd.service active",
                        lambda: ph.run(active, check=False).returncode == 0)
            cls.ready = None
            return
        # As the unit runs it, without systemd: its user, group, umask and config file, and a
        # stand-in for systemd's notification socket.
        cls.notify = ph.NotifySocket(mode=0o666)
        env = {"PATH": "/usr/bin:/bin", "NOTIFY_SOCKET": cls.notify.name}
        cls.daemon = ph.Daemon(["setpriv", "--reuid", "attnstat", "--regid", "attnstat",
                                "--init-groups", "--", "/usr/bin/attnstatd", "--config",
                                "/etc/attnstat/attnstatd.conf"],
                               env=env, log_dir=cls.tmp, preexec_fn=lambda: os.umask(0o027))
        cls.ready = cls.notify.wait("READY=1", proc=cls.daemon.proc)

    @classmethod
    def tearDownClass(cls):
        problems = []
        try:
            if cls.daemon is not None:
                code = cls.daemon.stop()
                if code != 0:
                    problems.append("attnstatd exited %d:\n%s" % (code, cls.daemon.log_text()))
                try:
                    cls.notify.wait("STOPPING=1")
                except AssertionError as e:
                    problems.append(str(e))
        finally:
            if cls.daemon is not None:
                cls.daemon.close()
            if cls.notify is not None:
                cls.notify.close()
            p = ph.run(["dpkg", "--purge"] + PKGS, check=False)
            if p.returncode != 0:
                problems.append("dpkg --purge: %s%s" % (p.stdout, p.stderr))
            for path in ("/usr/bin/attnstatd", "/etc/attnstat", "/var/lib/attnstat",
                         "/usr/lib/systemd/system/attnstatd.service",
                         "/usr/lib/python3/dist-packages/attnstat",
                         "/etc/systemd/system/multi-user.target.wants/attnstatd.service"):
                if os.path.lexists(path):
                    problems.append("%s is still there after dpkg --purge" % path)
            shutil.rmtree(cls.tmp, ignore_errors=True)
        if problems:
            raise AssertionError("\n".join(problems))

    def test_user_group_and_directories(self):
        pw = pwd.getpwnam("attnstat")
        gr = grp.getgrnam("attnstat")
        self.assertEqual(pw.pw_gid, gr.gr_gid)
        self.assertEqual(pw.pw_dir, "/var/lib/attnstat")
        self.assertLess(pw.pw_uid, 1000)  # a system user
        self.assertTrue(pw.pw_shell.endswith("nologin"))
        for d in ("/var/lib/attnstat", "/run/attnstat"):
            st = os.stat(d)
            self.assertEqual((st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)),
                             (pw.pw_uid, gr.gr_gid, 0o750), d)

    def test_binaries_answer_version(self):
        self.assertEqual(ph.run(["/usr/bin/attnstatd", "--version"]).stdout.strip(),
                         "attnstatd " + V)
        for b in ("attnstat", "attnstat-synth"):
            out = ph.run(["/usr/bin/" + b, "--version"]).stdout.strip()
            self.assertRegex(out, ph.version_line(b))

    def test_manual_pages(self):
        if man_excluded():
            self.skipTest("dpkg excludes /usr/share/man on this machine (path-exclude): the pages "
                          "are checked in the package (Built)")
        for page, sec in (("attnstatd", 8), ("attnstat", 1), ("attnstat-synth", 1)):
            path = "/usr/share/man/man%d/%s.%d.gz" % (sec, page, sec)
            self.assertTrue(os.path.exists(path), path)
            if shutil.which("man"):
                self.assertEqual(ph.run(["man", "-w", str(sec), page]).stdout.strip(), path)
            if shutil.which("groff"):
                p = subprocess.run("zcat %s | groff -man -ww -z" % path, shell=True,
                                   stderr=subprocess.PIPE, universal_newlines=True)
                self.assertEqual((p.returncode, p.stderr), (0, ""))

    def test_completion(self):
        prog = ('source /usr/share/bash-completion/completions/attnstat; COMP_WORDS=(attnstat st); '
                'COMP_CWORD=1; _attnstat; echo "${COMPREPLY[@]}"')
        self.assertEqual(ph.run(["bash", "--norc", "-c", prog]).stdout.strip(), "status")

    def test_unit_verifies(self):
        if not shutil.which("systemd-analyze"):
            self.skipTest("no systemd-analyze (Debian: systemd)")
        unit = "/usr/lib/systemd/system/attnstatd.service"
        cmd = ["systemd-analyze", "verify", unit]
        if man_excluded():
            cmd.insert(2, "--man=no")
        p = ph.run(cmd, check=False)
        self.assertEqual((p.returncode, p.stdout + p.stderr), (0, ""))
        p = ph.run(["systemd-analyze", "security", "--offline=true", "--no-pager", unit],
                   check=False)
        m = re.search(r"Overall exposure level for attnstatd.service: ([0-9.]+ \w+)", p.stdout)
        print("installed unit: systemd-analyze security --offline: %s"
              % (m.group(1) if m else p.stderr.strip()))

    def test_service_serves_status_and_python(self):
        if self.ready is not None:
            self.assertEqual(int(self.ready["MAINPID"]), self.daemon.proc.pid)
        st = os.stat(self.SOCK)
        self.assertEqual((pwd.getpwuid(st.st_uid).pw_name, stat.S_IMODE(st.st_mode)),
                         ("attnstat", 0o660))
        status = ph.cli_json("/usr/bin/attnstat", "--socket", self.SOCK, "status")[0]
        self.assertEqual(status["daemon_version"], V)
        self.assertRegex(status["client_version"], r"^%s(\+cuda)?$" % re.escape(V))
        # A trainer of the daemon's own user (see test_push_from_another_user for the others).
        run = "deb-python-%d" % os.getpid()
        out = self.push(["setpriv", "--reuid", "attnstat", "--regid", "attnstat", "--init-groups",
                         "--"], run)
        self.assertEqual(out["module"], "/usr/lib/python3/dist-packages/attnstat/__init__.py")
        libdir = libdir_of(contents(self.debs["libattnstat" + MAJOR]))
        self.assertEqual(out["library"], "%s/libattnstat.so.%s" % (libdir, V))
        ph.check_results(self, out, 2)
        runs = ph.cli_json("/usr/bin/attnstat", "--db", self.DB, "runs")
        self.assertEqual([r["samples"] for r in runs if r["run"] == run], [2 * out["heads"]])

    def push(self, prefix, run):
        env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
        return json.loads(ph.run(prefix + ["/usr/bin/python3", self.pusher, self.SOCK, run, "2"],
                                 cwd="/", env=env).stdout)

    def test_push_from_another_user(self):
        """A trainer whose user is not the daemon's, a member of the group attnstat as the service
        intends: its host ring is given the daemon's group (client/hostring.c)."""
        gid = grp.getgrnam("attnstat").gr_gid
        out = self.push(["setpriv", "--reuid", "65534", "--regid", "65534", "--groups", str(gid),
                         "--"], "deb-member-%d" % os.getpid())
        ph.check_results(self, out, 2)

    def test_group_members_only(self):
        gid = grp.getgrnam("attnstat").gr_gid
        member = ["setpriv", "--reuid", "65534", "--regid", "65534", "--groups", str(gid), "--"]
        outsider = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--"]
        env = {"PATH": "/usr/bin:/bin"}
        st = json.loads(ph.run(member + ["/usr/bin/attnstat", "--socket", self.SOCK, "status",
                                         "--format", "json"], env=env).stdout.splitlines()[0])
        self.assertEqual(st["daemon_version"], V)
        ph.run(member + ["/usr/bin/attnstat", "--db", self.DB, "runs"], env=env)
        p = ph.run(outsider + ["/usr/bin/attnstat", "--socket", self.SOCK, "status"], env=env,
                   check=False)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        p = ph.run(outsider + ["/usr/bin/attnstat", "--db", self.DB, "runs"], env=env, check=False)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)

    def test_c_users_build_against_it(self):
        src = os.path.join(self.tmp, "consumer")
        os.makedirs(src, exist_ok=True)
        with open(os.path.join(src, "main.c"), "w") as f:
            f.write('#include <stdio.h>\n#include <string.h>\n#include <attnstat.h>\n'
                    'int main(void) { printf("%s %s\\n", ATTNSTAT_VERSION, attnstat_version()); '
                    'return strncmp(ATTNSTAT_VERSION, attnstat_version(), '
                    'strlen(ATTNSTAT_VERSION)) != 0; }\n')
        with open(os.path.join(src, "CMakeLists.txt"), "w") as f:
            f.write("cmake_minimum_required(VERSION 3.22)\nproject(consumer C)\n"
                    "find_package(attnstat %s REQUIRED)\nadd_executable(consumer main.c)\n"
                    "target_link_libraries(consumer PRIVATE attnstat::attnstat)\n" % V)
        flags = ph.run(["pkg-config", "--cflags", "--libs", "attnstat"]).stdout.split()
        self.assertEqual(ph.run(["pkg-config", "--modversion", "attnstat"]).stdout.strip(), V)
        exe = os.path.join(self.tmp, "consumer-pc")
        ph.run(["cc", os.path.join(src, "main.c"), "-o", exe] + flags)
        self.assertTrue(ph.run([exe]).stdout.startswith(V + " " + V))
        bld = os.path.join(self.tmp, "consumer-build")
        ph.run(["cmake", "-S", src, "-B", bld, "-G", "Ninja"])
        ph.run(["cmake", "--build", bld])
        self.assertTrue(ph.run([os.path.join(bld, "consumer")]).stdout.startswith(V + " " + V))


if __name__ == "__main__":
    unittest.main(verbosity=2)
