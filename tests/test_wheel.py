#!/usr/bin/env python3
"""test_wheel.py — the Python package installed the way training jobs install it, offline:

1. The wheel: `cmake --build BUILD --target python-wheel` (Debian's python3-build, no build
   isolation, no package index) makes attnstat-V-py3-none-PLATFORM.whl; its libattnstat needs
   nothing but the C library and exports only attnstat_*.
2. A fresh venv that does NOT see the system's packages (no --system-site-packages: no NumPy, no
   Debian python3-attnstat), the wheel installed with `pip install --no-index`; from outside the
   source tree, with no PYTHONPATH, ATTNSTAT_LIB or LD_LIBRARY_PATH, it loads the wheel's own
   libattnstat and pushes fresh random float32 tensors (pkg_pusher.py: ctypes buffers read through
   __array_interface__, no NumPy) to a live attnstatd. The per-head entropy and max logit it gets
   back equal a pure-Python float64 computation, and the samples are in the database.
3. `pip install` of the source (client/python, copied out of the tree) into a venv that DOES see
   the system's packages (--system-site-packages), because offline the build backend (setuptools,
   wheel) can only come from Debian's python3-setuptools and python3-wheel. That package is pure
   Python and finds libattnstat by its soname (here through LD_LIBRARY_PATH, as ldconfig would
   for an installed library); a push from it is stored.
Run by ctest (test_wheel), which sets the paths; exits 77 when run otherwise or when Debian's
python3-venv / python3-build are missing.
"""
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import unittest
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pkghelpers as ph  # noqa: E402

BUILD, DAEMON, CLI, LIB = ph.need_env("ATTNSTAT_BUILD_DIR", "ATTNSTAT_DAEMON", "ATTNSTAT_CLI",
                                      "ATTNSTAT_LIB")
V = ph.header_version()
for mod, deb in (("venv", "python3-venv"), ("ensurepip", "python3-venv"), ("build", "python3-build"),
                 ("setuptools", "python3-setuptools"), ("wheel", "python3-wheel")):
    if importlib.util.find_spec(mod) is None:
        ph.skip("%s has no %s (Debian: %s)" % (sys.executable, mod, deb))

def clean_env(**extra):
    """The environment of a user's shell: none of the variables the tests or a build set."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ATTNSTAT_") and k not in ("PYTHONPATH", "LD_LIBRARY_PATH",
                                                          "LD_PRELOAD", "PYTHONHOME")}
    env.update(extra)
    return env


class Wheel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="attnstat-wheel-")
        cls.sock = os.path.join(cls.dir, "attnstatd.sock")
        cls.db = os.path.join(cls.dir, "attnstat.db")
        cls.daemon = ph.Daemon([DAEMON, "--socket", cls.sock, "--db", cls.db], log_dir=cls.dir)
        ph.wait_for("attnstatd", lambda: ph.connectable(cls.sock), proc=cls.daemon.proc)
        ph.run(["cmake", "--build", BUILD, "--target", "python-wheel"])
        dist = os.path.join(BUILD, "python", "dist")
        wheels = [os.path.join(dist, w) for w in os.listdir(dist) if w.endswith(".whl")]
        assert len(wheels) == 1, wheels
        cls.wheel = wheels[0]
        shutil.copy(os.path.join(ph.HERE, "pkg_pusher.py"), cls.dir)

    @classmethod
    def tearDownClass(cls):
        try:
            code = cls.daemon.stop()
            assert code == 0, "attnstatd exited %d:\n%s" % (code, cls.daemon.log_text())
        finally:
            cls.daemon.close()
            shutil.rmtree(cls.dir, ignore_errors=True)

    def venv(self, name, system_site=False):
        path = os.path.join(self.dir, name)
        cmd = [sys.executable, "-m", "venv", path]
        if system_site:
            cmd.insert(3, "--system-site-packages")
        ph.run(cmd, env=clean_env())
        return os.path.join(path, "bin", "python")

    def push(self, python, run, pushes, env):
        out = ph.run([python, os.path.join(self.dir, "pkg_pusher.py"), self.sock, run, str(pushes)],
                     cwd=self.dir, env=env, timeout=600).stdout
        return json.loads(out)

    def stored(self, run):
        runs = [r for r in ph.cli_json(CLI, "--db", self.db, "runs") if r["run"] == run]
        self.assertEqual(len(runs), 1, runs)
        return runs[0]["samples"]

    def test_wheel_contents(self):
        name = os.path.basename(self.wheel)
        self.assertRegex(name, r"^attnstat-%s-py3-none-linux_[a-z0-9_]+\.whl$" % re.escape(V))
        with zipfile.ZipFile(self.wheel) as z:
            names = z.namelist()
            self.assertIn("attnstat/libattnstat.so", names)
            self.assertIn("attnstat/torch/__init__.py", names)
            self.assertIn('__version__ = "%s"' % V, z.read("attnstat/_version.py").decode())
            wheel = z.read("attnstat-%s.dist-info/WHEEL" % V).decode()
            self.assertIn("Root-Is-Purelib: false", wheel)
            meta = z.read("attnstat-%s.dist-info/METADATA" % V).decode()
            self.assertRegex(meta, r"(?m)^Version: %s$" % re.escape(V))
            # NumPy is an extra, never a requirement
            self.assertRegex(meta, r"(?m)^Requires-Dist: numpy ; extra == .numpy.$")
            self.assertEqual(re.findall(r"(?m)^Requires-Dist: (?!.*; extra ==).*$", meta), [])
            lib = os.path.join(self.dir, "libattnstat.so")
            with open(lib, "wb") as f:
                f.write(z.read("attnstat/libattnstat.so"))
        needed = re.findall(r"NEEDED\s+(\S+)", ph.run(["objdump", "-p", lib]).stdout)
        self.assertTrue(needed)
        for n in needed:  # the C library only: no libprotobuf-c, no libcudart
            self.assertRegex(n, r"^(libc|libm|libdl|libpthread|librt|ld-linux[-\w]*)\.so")
        exported = ph.run(["nm", "-D", "--defined-only", lib]).stdout.split("\n")
        names = [l.split()[-1] for l in exported if l.strip()]
        self.assertIn("attnstat_push", names)
        self.assertEqual([n for n in names if not n.startswith("attnstat_")], [])

    def test_fresh_venv_without_system_packages(self):
        python = self.venv("venv-wheel")
        ph.run([python, "-m", "pip", "install", "--no-index", "--no-cache-dir", "-q", self.wheel],
               env=clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"))
        out = self.push(python, "wheel-venv", 3, clean_env())
        # attnstat.torch is there, and imports nothing until a monitor starts (no torch here).
        ph.run([python, "-c", "import attnstat.torch, sys; assert 'torch' not in sys.modules"],
               cwd=self.dir, env=clean_env())
        venv = os.path.join(self.dir, "venv-wheel")
        self.assertFalse(out["numpy_visible"], "the venv sees NumPy: it is not isolated")
        self.assertFalse([p for p in out["sys_path"] if "dist-packages" in p], out["sys_path"])
        self.assertTrue(out["module"].startswith(venv), out["module"])
        self.assertEqual(out["library"], os.path.join(os.path.dirname(out["module"]),
                                                      "libattnstat.so"))
        self.assertEqual(out["version"], V)
        self.assertRegex(out["library_version"], r"^%s(\+cuda)?$" % re.escape(V))
        self.assertEqual(out["daemon_version"], V)
        self.assertEqual(out["client_version"], out["library_version"])
        ph.check_results(self, out, 3)
        self.assertEqual(self.stored("wheel-venv"), 3 * out["heads"])

    def test_source_install_finds_the_library_by_soname(self):
        src = os.path.join(self.dir, "src")
        shutil.copytree(os.path.join(ph.SOURCE, "client", "python"), src,
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info",
                                                      "libattnstat.so*"))
        python = self.venv("venv-source", system_site=True)
        ph.run([python, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps",
                "--no-cache-dir", "-q", src],
               env=clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1",
                             ATTNSTAT_VERSION_HEADER=os.path.join(ph.SOURCE, "include",
                                                                  "attnstat.h")))
        libdir = os.path.dirname(os.path.realpath(LIB))
        out = self.push(python, "source-venv", 1, clean_env(LD_LIBRARY_PATH=libdir))
        self.assertTrue(out["module"].startswith(os.path.join(self.dir, "venv-source")))
        self.assertFalse(os.path.exists(os.path.join(os.path.dirname(out["module"]),
                                                     "libattnstat.so")))
        self.assertEqual(os.path.dirname(out["library"]), libdir)
        self.assertTrue(os.path.basename(out["library"]).startswith("libattnstat.so.%s"
                                                                    % V.split(".")[0]))
        self.assertEqual(out["version"], V)
        ph.check_results(self, out, 1)
        self.assertEqual(self.stored("source-venv"), out["heads"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
