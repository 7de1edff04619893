"""rolloutd: Python side of the rollout daemon (the wire codec in rolloutd.proto;
the client is built on it)."""
__version__ = "0.1.0"

from . import proto  # noqa: E402,F401  (the wire codec)
from .client import DEFAULT_URL, Client, DaemonError, Sample, Stream, TimeoutError_  # noqa: E402,F401
