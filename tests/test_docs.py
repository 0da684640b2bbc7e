#!/usr/bin/env python3
"""test_docs.py — one version everywhere, and what is generated from the option tables (manual
pages, bash completion, the example config: deploy/docgen.c) saying what --help says.

- Versions: attnstatd, attnstat and attnstat-synth --version (the last two with their libattnstat's
  attnstat_version()), the Python package of the source tree and CMake's project version all
  equal ATTNSTAT_VERSION of include/attnstat.h.
- attnstatd.8: every flag of `attnstatd --help` with its default; attnstat.1: every command of
  `attnstat --help` with every option its `--help` lists, and every global option; both render
  with groff without a warning; the .gz files the build installs are the same pages.
- Completion: `attnstat CMD --<TAB>` offers exactly the options of `attnstat CMD --help` and the
  global ones; `attnstat <TAB>` the commands; choice values (--format, --metric, --rule,
  --log-level); `attnstatd --<TAB>` every flag of its --help.
- attnstatd.conf: every setting, the service's values active, and attnstatd accepts the file
  (while a line out of range makes it refuse the file).
Run by ctest (test_docs), which sets the paths; exits 77 when run otherwise.
"""
import gzip
import os
import re
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pkghelpers as ph  # noqa: E402

DAEMON, CLI, SYNTH, GEN = ph.need_env("ATTNSTAT_DAEMON", "ATTNSTAT_CLI", "ATTNSTAT_SYNTH",
                                       "ATTNSTAT_GENERATED")
V = ph.header_version()


# The daemon's flags that spell settings another way (command line only), and what they set.
ALIASES = {"--web.listen-address": ("--metrics-bind", "--metrics-port")}


def daemon_flags():
    """{flag: default or None} of `attnstatd --help`."""
    out = ph.run([DAEMON, "--help"]).stdout
    flags, last = {}, None
    for line in out.splitlines():
        m = re.match(r"^  (--[a-z][a-z0-9.-]*)", line)
        if m:
            last = m.group(1)
            flags[last] = None
            continue
        m = re.match(r"^\s+default (\S+?),? ", line + " ")
        if m and last:
            flags[last] = m.group(1).rstrip(",;")
    return flags


def daemon_reloadable():
    """The flags `attnstatd --help` marks "SIGHUP reloads it"."""
    out, last = set(), None
    for line in ph.run([DAEMON, "--help"]).stdout.splitlines():
        m = re.match(r"^  (--[a-z][a-z0-9.-]*)", line)
        if m:
            last = m.group(1)
        if last and "SIGHUP reloads it" in line:
            out.add(last)
    return out


def cli_commands():
    """The commands of `attnstat --help`."""
    out = ph.run([CLI, "--help"]).stdout
    cmds = []
    section = None
    for line in out.splitlines():
        if line.startswith("History") or line.startswith("Live"):
            section = "cmds"
        elif line.startswith("Global options"):
            section = None
        elif section == "cmds" and re.match(r"^  [a-z]", line):
            cmds.append(line.split()[0])
    return cmds


def option_names(text, section_start):
    """The long options listed after the line starting with section_start."""
    names, inside = [], False
    for line in text.splitlines():
        if line.startswith(section_start):
            inside = True
            continue
        if inside:
            if line and not line.startswith(" "):
                break
            m = re.match(r"^  (?:-[a-z], )?(--[a-z][a-z0-9-]*)", line)
            if m:
                names.append(m.group(1))
    return names


def cli_globals():
    return option_names(ph.run([CLI, "--help"]).stdout, "Global options")


def cli_options(cmd):
    return option_names(ph.run([CLI, cmd, "--help"]).stdout, "Options:")


def roff_text(path):
    """The page's source with roff's escapes of '-' undone."""
    with open(path) as f:
        return f.read().replace("\\-", "-")


def complete(script, func, words):
    """COMPREPLY of the completion function for COMP_WORDS = words (the last one is completed)."""
    prog = ('source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); '
            'COMPREPLY=(); %s; printf "%%s\\n" "${COMPREPLY[@]}"' % func)
    out = ph.run(["bash", "--norc", "--noprofile", "-c", prog, "complete", script] + words).stdout
    return set(l for l in out.splitlines() if l)


class Versions(unittest.TestCase):
    def test_binaries(self):
        self.assertEqual(ph.run([DAEMON, "--version"]).stdout.strip(), "attnstatd " + V)
        out = ph.run([CLI, "--version"]).stdout.strip()
        self.assertRegex(out, ph.version_line("attnstat"))
        # a global option: after a command too
        self.assertEqual(ph.run([CLI, "runs", "--version"]).stdout.strip(), out)
        out = ph.run([SYNTH, "--version"]).stdout.strip()
        self.assertRegex(out, ph.version_line("attnstat-synth"))

    def test_python(self):
        out = ph.run([sys.executable, "-c", "import attnstat; print(attnstat.__version__)"],
                     cwd=os.path.join(ph.SOURCE, "client", "python")).stdout.strip()
        self.assertEqual(out, V)

    def test_cmake(self):
        self.assertEqual(os.environ.get("ATTNSTAT_PROJECT_VERSION"), V)


class Manual(unittest.TestCase):
    def test_daemon_page_has_every_setting(self):
        text = roff_text(os.path.join(GEN, "attnstatd.8"))
        flags = daemon_flags()
        reloadable = daemon_reloadable()
        self.assertGreater(len(flags), 20)
        self.assertGreater(len(reloadable), 5)
        self.assertLess(len(reloadable), len(flags))
        for flag, default in flags.items():
            if flag == "--config" or flag in ALIASES:
                continue
            self.assertTrue(flag in text, "%s is not in attnstatd.8" % flag)
            if default is not None:
                key = flag[2:].replace("-", "_")
                entry = text[text.index(".BI %s " % flag):]
                entry = entry[:entry.index(".TP")]
                self.assertIn("default %s" % default, entry.lower(), flag)
                self.assertIn("key: \\fB%s\\fR" % key, entry)
                self.assertEqual("SIGHUP reloads it" in entry, flag in reloadable, flag)
        for flag, settings in ALIASES.items():  # said with what it sets, as a flag only
            entry = text[text.index(".BI %s " % flag):]
            entry = entry[:entry.index(".TP")]
            for setting in settings:
                self.assertIn(setting, entry, flag)
            self.assertIn("command-line flag only", entry, flag)
        self.assertIn(".TH ATTNSTATD 8", text)
        self.assertIn("attnstat %s" % V, text)

    def test_cli_page_has_every_command_and_option(self):
        text = roff_text(os.path.join(GEN, "attnstat.1"))
        cmds = cli_commands()
        self.assertEqual(set(cmds), {"runs", "trend", "heads", "alerts", "status", "watch",
                                          "check-db", "job", "export", "delete-run",
                                          "retention", "top", "diff", "interventions"})
        for cmd in cmds:
            start = text.index('.SS "%s"' % cmd)
            nxt = [i for i in (text.find(".SS", start + 3), text.find(".SH", start)) if i > 0]
            section = text[start:min(nxt)]
            for opt in cli_options(cmd):
                self.assertIn("\\fB%s\\fR" % opt, section, "%s %s" % (cmd, opt))
        glob = text[text.index(".SH GLOBAL OPTIONS"):]
        for opt in cli_globals():
            self.assertIn("\\fB%s\\fR" % opt, glob)
        self.assertIn("--version", cli_globals())

    def test_pages_render_cleanly(self):
        if not shutil.which("groff"):
            self.skipTest("no groff (Debian: groff-base)")
        for page in ("attnstatd.8", "attnstat.1"):
            p = ph.run(["groff", "-man", "-ww", "-z", os.path.join(GEN, page)])
            self.assertEqual(p.stderr, "", page)
            with gzip.open(os.path.join(GEN, page + ".gz")) as z, \
                    open(os.path.join(GEN, page), "rb") as f:
                self.assertEqual(z.read(), f.read())


class Completion(unittest.TestCase):
    def setUp(self):
        if not shutil.which("bash"):
            self.skipTest("no bash")
        self.cli = os.path.join(GEN, "attnstat.bash")
        self.daemon = os.path.join(GEN, "attnstatd.bash")

    def test_each_command_offers_exactly_its_options(self):
        glob = set(cli_globals())
        for cmd in cli_commands():
            got = complete(self.cli, "_attnstat", ["attnstat", "--db", "x.db", cmd, "--"])
            self.assertEqual(got, set(cli_options(cmd)) | glob, cmd)

    def test_commands_and_values(self):
        got = complete(self.cli, "_attnstat", ["attnstat", ""])
        self.assertEqual(got, set(cli_commands()) | {"help"} | set(cli_globals()))
        self.assertEqual(complete(self.cli, "_attnstat", ["attnstat", "help", "t"]),
                         {"trend", "top"})
        self.assertEqual(complete(self.cli, "_attnstat", ["attnstat", "heads", "--metric", ""]),
                         {"entropy_norm", "entropy", "max_logit", "sink_mass", "distance"})
        self.assertEqual(complete(self.cli, "_attnstat", ["attnstat", "--format", "=", "j"]),
                         {"json", "jsonl"})
        rules = complete(self.cli, "_attnstat", ["attnstat", "alerts", "--rule", ""])
        self.assertIn("logit_ceiling", rules)
        self.assertEqual(complete(self.cli, "_attnstat", ["attnstat", "alerts", "--layer", ""]),
                         set())

    def test_daemon_flags(self):
        got = complete(self.daemon, "_attnstatd", ["attnstatd", "--"])
        self.assertEqual(got, set(daemon_flags()) | {"--help", "--version", "--config"})
        self.assertEqual(complete(self.daemon, "_attnstatd", ["attnstatd", "--log-level", ""]),
                         {"debug", "info", "warn", "error"})


class ExampleConfig(unittest.TestCase):
    def test_every_setting_and_the_service_values(self):
        with open(os.path.join(GEN, "attnstatd.conf")) as f:
            lines = f.read().splitlines()
        active = dict(l.split(" = ", 1) for l in lines if l and not l.startswith("#"))
        self.assertEqual(active, {"socket": "/run/attnstat/attnstatd.sock",
                                  "db": "/var/lib/attnstat/attnstat.db",
                                  "allow_group": "attnstat"})
        keys = set()
        for l in lines:
            m = re.match(r"^(?:# )?([a-z_]+) =", l)
            if m:
                keys.add(m.group(1))
        self.assertEqual(keys, set(f[2:].replace("-", "_") for f in daemon_flags()
                                   if f not in ALIASES)
                         - {"config", "help", "version"})

    def test_the_daemon_accepts_it(self):
        conf = os.path.join(GEN, "attnstatd.conf")
        # --help returns once the config file is read: exit 0 means every line was accepted.
        ph.run([DAEMON, "--config", conf, "--help"])
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "bad.conf")
            shutil.copy(conf, bad)
            with open(bad, "a") as f:
                f.write("max_frame = 1\n")
            p = ph.run([DAEMON, "--config", bad, "--help"], check=False)
            self.assertEqual(p.returncode, 2)
            self.assertIn("max_frame", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
