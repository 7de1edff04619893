"""rolloutd: Python side of the rollout daemon (the wire codec in rolloutd.proto;
the client is built on it; Pool drives several daemons at once)."""
__version__ = "0.1.0"

from . import proto  # noqa: E402,F401  (the wire codec)
from .client import (DEFAULT_URL, Client, DaemonError, PreparedUpdate, PushResult, Sample, Stream,  # noqa: E402,F401
                     TimeoutError_, VersionMismatch, bf16_bits, prepare_update)
from .pool import Pool, PoolError, PoolStream  # noqa: E402,F401
