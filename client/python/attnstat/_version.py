"""The version of attnstat. An installed package has it written here when it is built (setup.py,
deploy/CMakeLists.txt); in the source tree it is read from include/attnstat.h, the one place
attnstat's version is written."""
import os
import re


def _from_header():
    header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                          "include", "attnstat.h")
    try:
        with open(header) as f:
            m = re.search(r'^#define ATTNSTAT_VERSION "([^"]+)"$', f.read(), re.M)
    except OSError:
        m = None
    return m.group(1) if m else "0+unknown"


__version__ = _from_header()
