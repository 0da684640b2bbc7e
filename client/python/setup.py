"""setup.py — the two things pyproject.toml cannot declare:

- The version. attnstat has one, ATTNSTAT_VERSION in include/attnstat.h; it is read from there
  ($ATTNSTAT_VERSION_HEADER names the header when the package was copied out of the source tree;
  an sdist has its PKG-INFO) and written into the built package as attnstat/_version.py.
- The library. When attnstat/libattnstat.so is present (the python-wheel target puts it there:
  deploy/wheel.cmake), the wheel carries it and is tagged for this platform (py3-none-PLATFORM:
  ctypes needs no particular Python ABI). Without it the package is pure Python and finds the
  installed libattnstat by its soname.
"""
import os
import re

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(HERE, "attnstat", "libattnstat.so")


def read_version():
    header = os.environ.get("ATTNSTAT_VERSION_HEADER") or os.path.join(
        HERE, "..", "..", "include", "attnstat.h")
    if os.path.exists(header):
        with open(header) as f:
            m = re.search(r'^#define ATTNSTAT_VERSION "([0-9]+\.[0-9]+\.[0-9]+)"$', f.read(), re.M)
        if not m:
            raise SystemExit("%s has no line '#define ATTNSTAT_VERSION \"X.Y.Z\"'" % header)
        return m.group(1)
    pkg_info = os.path.join(HERE, "PKG-INFO")  # building from an sdist
    if os.path.exists(pkg_info):
        with open(pkg_info) as f:
            m = re.search(r"^Version: (\S+)$", f.read(), re.M)
        if m:
            return m.group(1)
    raise SystemExit("attnstat's version is in include/attnstat.h, which is not at %s: build from "
                     "the source tree, or set ATTNSTAT_VERSION_HEADER to the header" % header)


VERSION = read_version()


def vocab_module():
    """The text of attnstat/_vocab.py with vocab/vocab.h's tables written in, or None when the
    package's _vocab.py already holds them (an sdist). When the package was copied out of the
    source tree, $ATTNSTAT_VOCAB_HEADER names the header, or it is found in the tree that
    $ATTNSTAT_VERSION_HEADER names."""
    header = os.environ.get("ATTNSTAT_VOCAB_HEADER")
    if not header:
        header = os.path.join(HERE, "..", "..", "vocab", "vocab.h")
        version_header = os.environ.get("ATTNSTAT_VERSION_HEADER")
        if not os.path.exists(header) and version_header:
            header = os.path.join(os.path.dirname(os.path.abspath(version_header)), "..",
                                  "vocab", "vocab.h")
    src = os.path.join(HERE, "attnstat", "_vocab.py")
    with open(src) as f:
        text = f.read()
    if "def parse(" not in text:
        return None
    if not os.path.exists(header):
        raise SystemExit("attnstat's tables are in vocab/vocab.h, which is not at %s: build from "
                         "the source tree, or set ATTNSTAT_VOCAB_HEADER to the header" % header)
    scope = {"__name__": "attnstat_vocab_build", "__file__": src}
    os.environ["ATTNSTAT_VOCAB_HEADER"] = header
    exec(compile(text, src, "exec"), scope)
    with open(header) as f:
        return scope["emit"](scope["parse"](f.read()))


class BuildPy(build_py):
    """Writes the version into the built package's attnstat/_version.py, and the tables of
    statistics and rules into its attnstat/_vocab.py."""

    def run(self):
        super().run()
        path = os.path.join(self.build_lib, "attnstat", "_version.py")
        with open(path, "w") as f:
            f.write('"""The version of attnstat, written at build time (include/attnstat.h\'s '
                    'ATTNSTAT_VERSION)."""\n__version__ = "%s"\n' % VERSION)
        vocab = vocab_module()
        if vocab is not None:
            with open(os.path.join(self.build_lib, "attnstat", "_vocab.py"), "w") as f:
                f.write(vocab)


cmdclass = {"build_py": BuildPy}
extra = {}
if os.path.exists(LIB):
    from wheel.bdist_wheel import bdist_wheel

    class WithLibrary(Distribution):
        """Carries a compiled library: installed as platform code, not as pure Python."""

        def has_ext_modules(self):
            return True

    class PlatformWheel(bdist_wheel):
        """Tagged for this platform and any Python 3 (ctypes uses no Python ABI)."""

        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])

    cmdclass["bdist_wheel"] = PlatformWheel
    extra = {"distclass": WithLibrary, "package_data": {"attnstat": ["libattnstat.so"]}}

setup(version=VERSION, cmdclass=cmdclass, **extra)
