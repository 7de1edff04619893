"""The TCP bytes this process sends to a set of daemons, as the kernel counts
them (tcpi_bytes_sent of each socket): a learner's egress, for tests and
benchmarks of weight pushes.

    with Egress([7070, 7072]) as e:     # the daemons' learner ports
        pool.push_weights(...)
    e.bytes

Data lane sockets (opened by rolloutd.client through socket.create_connection)
are read just before they close; the NNG connections to the given ports are
read before and after through `ss`. Linux only (struct tcp_info of 4.19+)."""
import socket
import struct
import subprocess

import rolloutd.client as _rc

TCP_INFO_BYTES_SENT = 200       # offset of tcpi_bytes_sent (u64) in struct tcp_info


def bytes_sent(sock):
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("<Q", info, TCP_INFO_BYTES_SENT)[0]


class _CountedSocket(socket.socket):
    __slots__ = ()
    closed_bytes = [0]

    def close(self):
        if self.fileno() >= 0:
            try:
                _CountedSocket.closed_bytes[0] += bytes_sent(self)
            except OSError:
                pass
        super().close()


def nng_bytes_sent(ports):
    """tcpi_bytes_sent summed over this network namespace's established
    sockets whose peer port is one of ports."""
    total = 0
    for port in ports:
        out = subprocess.run(["ss", "-tinH", "state", "established", f"dport = :{port}"], capture_output=True,
                             text=True, check=True).stdout
        for field in out.split():
            if field.startswith("bytes_sent:"):
                total += int(field.split(":")[1])
    return total


class Egress:
    def __init__(self, ports):
        self.ports = list(ports)
        self.bytes = 0

    def __enter__(self):
        self._orig = _rc.socket.create_connection

        def create_connection(*a, **kw):
            s = self._orig(*a, **kw)
            s.__class__ = _CountedSocket
            return s
        _rc.socket.create_connection = create_connection
        _CountedSocket.closed_bytes[0] = 0
        self.nng0 = nng_bytes_sent(self.ports)
        return self

    def __exit__(self, *exc):
        _rc.socket.create_connection = self._orig
        self.bytes = _CountedSocket.closed_bytes[0] + nng_bytes_sent(self.ports) - self.nng0
