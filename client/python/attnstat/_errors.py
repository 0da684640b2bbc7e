"""attnstat.AttnstatError: what a failed libattnstat call raises."""
from . import _lib


class AttnstatError(Exception):
    """A failed libattnstat call. .code is the attnstat_code (an int), .code_name its name
    ("EINVAL", ...), and the message is the library's sentence."""

    def __init__(self, code, message):
        self.code = int(code)
        self.code_name = _lib.CODE_NAMES.get(self.code, "code %d" % self.code)
        self.message = message
        Exception.__init__(self, "%s: %s" % (self.code_name, message) if message
                           else self.code_name)
