#!/usr/bin/env python3
"""build_wheel.py SRC DIST — builds the wheel of the Python package staged in SRC into DIST with
Debian's PEP 517 front end (python3-build) and no build isolation: no package index is needed, the
build backend (setuptools, wheel) is the system's. Run by the python-wheel target
(deploy/wheel.cmake); says what to install when a tool is missing. Prints the wheel's path.
"""
import glob
import importlib.util
import os
import subprocess
import sys


def main():
    if len(sys.argv) != 3:
        print("usage: build_wheel.py SRC DIST", file=sys.stderr)
        return 2
    src, dist = sys.argv[1], sys.argv[2]
    missing = [deb for mod, deb in (("build", "python3-build"), ("setuptools", "python3-setuptools"),
                                    ("wheel", "python3-wheel"))
               if importlib.util.find_spec(mod) is None]
    if missing:
        print("python-wheel: %s lacks %s (Debian: apt-get install %s)"
              % (sys.executable, ", ".join(missing), " ".join(missing)), file=sys.stderr)
        return 1
    rc = subprocess.call([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                          "--outdir", dist, src])
    if rc != 0:
        return rc
    wheels = glob.glob(os.path.join(dist, "*.whl"))
    if len(wheels) != 1:
        print("python-wheel: expected one wheel in %s, found %s" % (dist, wheels), file=sys.stderr)
        return 1
    print(wheels[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
