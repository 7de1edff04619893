"""rolloutd: Python side of the rollout daemon (the wire codec in rolloutd.proto;
the client is built on it)."""
__version__ = "0.1.0"
