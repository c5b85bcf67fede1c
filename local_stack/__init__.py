"""Local stack manager: the real infrastructure on one machine, on loopback.

Not a deployable: development, tests, the demo and benchmarks use it.
"""

from local_stack.errors import StackError
from local_stack.stack import StackInfo, down, link_name, load, status, up
from local_stack.toxiproxy import Toxiproxy

__all__ = ["StackError", "StackInfo", "Toxiproxy", "down", "link_name", "load", "status", "up"]
