"""The process-wide state the doors (_install.py) and the compiled graph's operators (_op.py)
share: which monitor is active, and what compiled graphs hold. Imports threading alone."""
import threading


class _State(object):
    def __init__(self):
        self.monitor = None      # the active monitor, at most one per process
        self.trace_depth = 0     # inside a door while Dynamo traces: inner doors stay quiet
        self.traced = False      # a compiled graph holds an attnstat operator
        self.cudagraphs = False  # one was compiled with CUDA graphs (mode="reduce-overhead")
        self.last_monitor = None  # the monitor that left last (its late Acks still count there)


STATE = _State()
CALLS = threading.local()  # .n: this thread's door calls while a monitor was active (_unseen.py)
