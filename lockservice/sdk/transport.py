"""A lean keep-alive HTTP/1.1 transport for the SDK (`http://`, and `https://` given an
`ssl.SSLContext`), under httpx's API.

Why: httpcore + h11 + anyio cost more pure Python per request than an acquire+release's whole
server side. Measured in the same run against httpx's own transport (`make bench-locks`, its
`ab` key: the same TLS context and limits, ten interleaved rounds; docs/performance.md, issue
30): the client's CPU per acquire+release was 1.67 ms against 3.17 ms, 1.74 against 3.13 and
1.71 against 3.03 in three runs, every round of this transport below every round of httpx's;
p50 7.99 against 9.70 ms, 8.13 against 10.61 and 9.12 against 10.88 (a shared machine, loadavg
2.8-6.6). This transport keeps a few idle connections and frames requests by hand; responses are
parsed by `httptools` (the C parser uvicorn uses). httpx still builds requests and responses, so
timeouts, errors and the SDK's retry rules are unchanged: every failure is an `httpx.TransportError`
subclass (ConnectError, ReadError, ReadTimeout, ...), which the SDK retries a bounded number of
times exactly as before. Must never: reuse a connection whose exchange did not complete (it could
carry a late answer to an earlier request), or retry a request on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

import httptools
import httpx

_MAX_IDLE = 4


class _Parsed:
    """httptools callbacks: collects one response."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.done = True


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class KeepAliveTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 with keep-alive over asyncio streams; one request per connection at a time."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._idle: list[_Conn] = []
        #: https: every connection's TLS (the server verified by the context, host name checked).
        self._ssl = ssl_context
        self._scheme = "https" if ssl_context is not None else "http"

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != self._scheme:
            raise httpx.UnsupportedProtocol(
                f"this KeepAliveTransport serves {self._scheme}:// only (https: give it a context)"
            )
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        body = await request.aread()
        head = [f"{request.method} ".encode() + request.url.raw_path + b" HTTP/1.1\r\n"]
        head += [name + b": " + value + b"\r\n" for name, value in request.headers.raw]
        payload = b"".join(head) + b"\r\n" + body
        conn = await self._connection(request, timeouts.get("connect"))
        reader, writer = conn
        complete = False
        try:
            try:
                writer.write(payload)
                await asyncio.wait_for(writer.drain(), timeouts.get("write"))
            except TimeoutError as exc:
                raise httpx.WriteTimeout("write timed out", request=request) from exc
            except OSError as exc:
                raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from exc
            parsed = _Parsed()
            parser = httptools.HttpResponseParser(parsed)
            try:
                await asyncio.wait_for(self._read(reader, parser, parsed), timeouts.get("read"))
            except TimeoutError as exc:
                raise httpx.ReadTimeout("read timed out", request=request) from exc
            except OSError as exc:
                raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc
            except httptools.HttpParserError as exc:
                raise httpx.RemoteProtocolError(str(exc), request=request) from exc
            # HTTP/1.1 keeps the connection unless the server said close (httptools resets its
            # own should_keep_alive() once the message is complete, so decide from the headers).
            complete = parser.get_http_version() == "1.1" and not any(
                n.lower() == b"connection" and v.lower() == b"close" for n, v in parsed.headers
            )
            return httpx.Response(
                parser.get_status_code(),
                headers=parsed.headers,
                content=bytes(parsed.body),
                request=request,
                extensions={"http_version": b"HTTP/1.1"},
            )
        finally:
            if complete and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
            else:
                _close(writer)

    @staticmethod
    async def _read(reader: asyncio.StreamReader, parser: Any, parsed: _Parsed) -> None:
        while not parsed.done:
            chunk = await reader.read(65536)
            if not chunk:
                raise ConnectionResetError("server closed the connection")
            parser.feed_data(chunk)

    async def _connection(self, request: httpx.Request, connect_s: float | None) -> _Conn:
        while self._idle:
            reader, writer = self._idle.pop()
            # An idle connection the server has closed (keep-alive timeout) shows EOF here.
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            _close(writer)
        host = request.url.host
        port = request.url.port or (443 if self._ssl else 80)
        tls: dict[str, Any] = {"ssl": self._ssl, "server_hostname": host} if self._ssl else {}
        try:
            return await asyncio.wait_for(asyncio.open_connection(host, port, **tls), connect_s)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("connect timed out", request=request) from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            _close(writer)


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):  # closing a broken socket must not mask the real error
        writer.close()
