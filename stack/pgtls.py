"""PostgreSQL's TLS front: `python -m stack.pgtls`, the TLS endpoint of a server built without SSL.

pgserver's build (the embedded PostgreSQL of the local stack, and the compose stand-in) has no
SSL ("SSL is not supported by this build"), so `ssl=on` is impossible there. This front listens
on the server's TCP address in its place, speaks PostgreSQL's own TLS negotiation (the client's
SSLRequest, answered `S`, then the TLS handshake), and forwards the decrypted protocol to the
server's Unix socket, which is the server's only listener (no TCP: `-h ''`). Every standard
client (asyncpg, libpq and psql) then connects with `sslmode=verify-full` unchanged and verifies
the server's certificate and host name; a plaintext startup gets a FATAL error and the
connection is closed, so no session crosses TCP unencrypted (docs/security.md).

Owns: the negotiation (SSLRequest: TLS; GSSENCRequest: "N", then the client may ask for TLS;
CancelRequest: forwarded as it is, as PostgreSQL itself accepts one over plaintext with
`hostssl`-only rules, since it carries only a backend's pid and cancel key; anything else:
refused), and the byte pipe in both directions afterwards. Must never: forward a startup message
that did not arrive over TLS, answer `S` before the server's socket accepted the connection (a
dead server must look like one: the connection closes), or read, log or change the protocol
it forwards.

Why written here rather than taken from a package: the TLS terminators that speak this
negotiation (stunnel's `protocol = pgsql`, pgbouncer) are Debian packages, and the local
stack must start as any user with nothing but Python installed (`make demo`); HAProxy and
the like cannot answer an SSLRequest at all. The cost of the extra hop is measured by
`make bench-e2e` and `make bench-locks` with TLS on and off (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import ssl
import struct
import sys
from collections.abc import Sequence
from typing import cast

import uvloop

from common.logs import configure_logging, get_logger
from common.tls import server_context

log = get_logger("stack.pgtls")

#: The request codes of PostgreSQL's negotiation messages (an 8- or 16-byte packet: Int32
#: length, Int32 code; protocol docs, "Message Formats").
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
#: What a client may send before its startup message is decided; a longer packet is a startup
#: message (or garbage) and is refused without reading it.
_SHORT = 8
_CANCEL_LEN = 16
#: A client that neither negotiates nor hands over within this long is dropped.
_NEGOTIATION_TIMEOUT_S = 10.0


def refusal(message: str) -> bytes:
    """A protocol-3 ErrorResponse (severity FATAL, SQLSTATE 28000) a plaintext client prints."""
    fields = b"".join(
        code + text.encode() + b"\0"
        for code, text in ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", "28000"), (b"M", message))
    )
    body = fields + b"\0"
    return b"E" + struct.pack("!I", len(body) + 4) + body


PLAINTEXT_REFUSED = refusal(
    "this server accepts TLS connections only: connect with sslmode=verify-full and "
    "sslrootcert=<the CA file>"
)


class Front:
    """One listening front: TLS from clients on (host, port), plaintext to `upstream_socket`."""

    def __init__(self, upstream_socket: str, context: ssl.SSLContext) -> None:
        self.upstream_socket = upstream_socket
        self.context = context

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._negotiate(reader, writer)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away or failed its handshake: nothing was forwarded
        finally:
            writer.close()
            # Once upgraded to TLS (`_tls_session`), the connection's transport reports to the
            # TLS protocol, and the stream never hears of its close: waiting for it would hold
            # this task for ever, and the process's exit with it (asyncio.run waits for every
            # task). The TLS session closed both halves itself.
            if isinstance(writer.transport.get_protocol(), asyncio.StreamReaderProtocol):
                with contextlib.suppress(OSError, ssl.SSLError):
                    await writer.wait_closed()

    async def _negotiate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):  # at most one GSSENCRequest ("N") before the SSLRequest
            head = await asyncio.wait_for(reader.readexactly(_SHORT), _NEGOTIATION_TIMEOUT_S)
            length, code = struct.unpack("!II", head)
            if length == _SHORT and code == GSSENC_REQUEST:
                writer.write(b"N")
                await writer.drain()
                continue
            if length == _SHORT and code == SSL_REQUEST:
                await self._tls_session(writer)
                return
            if length == _CANCEL_LEN and code == CANCEL_REQUEST:
                rest = await asyncio.wait_for(reader.readexactly(8), _NEGOTIATION_TIMEOUT_S)
                await self._forward_cancel(head + rest)
                return
            break
        # A startup message in plaintext (sslmode=disable), or anything else: refused.
        log.warning("pgtls.plaintext_refused")
        writer.write(PLAINTEXT_REFUSED)
        await writer.drain()

    async def _tls_session(self, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        client, server = _Half(), _Half()
        client.peer, server.peer = server, client
        # The server's socket first: if it is down, the client's connection closes before any
        # "S", as it would against the server itself (asyncpg and libpq then try the next host
        # of a multi-host DSN).
        try:
            await loop.create_unix_connection(lambda: server, self.upstream_socket)
        except OSError:
            return
        try:
            writer.write(b"S")
            # No await between the "S" and start_tls: the client's handshake, sent only once it
            # has read the "S", is read by the TLS layer, never by the stream's buffer.
            tls = await loop.start_tls(
                writer.transport,
                client,
                self.context,
                server_side=True,
                ssl_handshake_timeout=_NEGOTIATION_TIMEOUT_S,
            )
            assert tls is not None
            client.attach(tls)  # from here both directions are protocol callbacks
            await asyncio.gather(client.closed, server.closed)
        finally:
            server.close()
            client.close()

    async def _forward_cancel(self, packet: bytes) -> None:
        with contextlib.suppress(OSError):
            _, up_writer = await asyncio.open_unix_connection(self.upstream_socket)
            up_writer.write(packet)
            await up_writer.drain()
            up_writer.close()
            await up_writer.wait_closed()


class _Half(asyncio.Protocol):
    """One side of a session's pipe: what its transport receives is written to the other
    side's transport, as it arrives (protocol callbacks, no task per direction). A copy loop on
    streams took a third more of the front's CPU per query (median 48 against 36 us over four
    interleaved runs of `python -m lab.bench.pgtls`, docs/performance.md). A full write buffer
    on one side pauses reading on the other; either side closing closes both."""

    def __init__(self) -> None:
        self.peer: _Half | None = None
        self.transport: asyncio.Transport | None = None
        #: What arrived for this side before its transport was attached (the client's TLS
        #: transport exists only once start_tls returns; the server may answer before that).
        self._pending: list[bytes] = []
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.attach(cast(asyncio.Transport, transport))

    def attach(self, transport: asyncio.Transport) -> None:
        # uvloop's transports are not registered as asyncio.Transport subclasses: no isinstance.
        self.transport = transport
        for data in self._pending:
            transport.write(data)
        self._pending.clear()

    def send(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)
        else:
            self._pending.append(data)

    def data_received(self, data: bytes) -> None:
        assert self.peer is not None
        self.peer.send(data)

    def eof_received(self) -> bool:
        return False  # close: a PostgreSQL session has no use for a half-open connection

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        if self.peer is not None:
            self.peer.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        elif self.transport is None and not self.closed.done():
            self.closed.set_result(None)


async def _parent_gone(parent: int, stop: asyncio.Event) -> None:
    """Set `stop` once this process has been re-parented (its parent died, even by SIGKILL)."""
    # Nothing signals a re-parenting; polling once a second is cheap and bounded.
    while os.getppid() == parent:  # noqa: ASYNC110
        await asyncio.sleep(1.0)
    stop.set()


async def serve(
    host: str,
    port: int,
    upstream_socket: str,
    context: ssl.SSLContext,
    *,
    exit_with_parent: bool = False,
) -> None:
    """Listen until SIGTERM or SIGINT (or, with `exit_with_parent`, the parent's death)."""
    front = Front(upstream_socket, context)
    server = await asyncio.start_server(front.handle, host, port, backlog=1024)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch = asyncio.create_task(_parent_gone(os.getppid(), stop)) if exit_with_parent else None
    log.info("pgtls.started", listen=f"{host}:{port}", upstream=upstream_socket)
    async with server:
        await stop.wait()
    if watch is not None:
        watch.cancel()
    log.info("pgtls.stopped")


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stack.pgtls", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--listen", type=_address, required=True, help="HOST:PORT clients reach")
    parser.add_argument(
        "--upstream-socket", required=True, help="the server's Unix socket (.../.s.PGSQL.PORT)"
    )
    parser.add_argument("--cert-file", required=True, help="the server certificate chain (PEM)")
    parser.add_argument("--key-file", required=True, help="its private key (PEM)")
    parser.add_argument(
        "--exit-with-parent", action="store_true", help="stop when the parent process dies"
    )
    args = parser.parse_args(argv)
    configure_logging("pgtls", service=True)
    try:
        context = server_context(args.cert_file, args.key_file)
    except (OSError, ssl.SSLError) as exc:  # unreadable, or a key that is not the cert's
        log.error("pgtls.refused_to_start", reason=str(exc), cert_file=args.cert_file)
        return 2
    host, port = args.listen
    # uvicorn[standard]'s loop, the one our HTTP services run on.
    uvloop.run(
        serve(host, port, args.upstream_socket, context, exit_with_parent=args.exit_with_parent)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
