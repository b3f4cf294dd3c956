#!/usr/bin/env python3
"""Real WebSocket, server-sent-events and gRPC servers and clients for the protocol tests
(tests/tests/integration/protocols.rs) and the WebSocket bench (tests/benches/websocket.rs).

Each subcommand prints what it saw on standard output, one line (JSON where there is more than a
word), and listens on loopback only. Servers print `ready` once they listen. The libraries are
`websockets` and `grpcio`, installed by scripts/test; gRPC messages are raw bytes through
generic handlers (no generated stubs), which is what goes over the wire either way.
"""

import asyncio
import json
import ssl
import sys
import time


def client_tls():
    """TLS towards sozu: the tests' certificates are self-signed, and what is tested is the
    route, not the chain."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def ready():
    print("ready", flush=True)


# --- WebSocket ---------------------------------------------------------------------------------


async def ws_server(port, addresses, name, tls=None):
    """Echoes every message (`who` is answered with the server's name); with `tls`, a
    (certificate, key) pair, it speaks TLS itself: the bench's direct wss baseline."""
    import websockets

    async def echo(ws):
        try:
            async for message in ws:
                if message == "who":
                    await ws.send(name)
                else:
                    await ws.send(message)
        except websockets.exceptions.ConnectionClosed:
            # Broken under it (sozu killed, a drain): the client sees that; no error of the echo's.
            pass

    ctx = None
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*tls)
    servers = [await websockets.serve(echo, a, port, ping_interval=None, ssl=ctx, max_size=None)
               for a in addresses]
    ready()
    await asyncio.gather(*(s.serve_forever() for s in servers))


async def connect(port, host, tls):
    import websockets

    scheme = "wss" if tls else "ws"
    return await websockets.connect(
        f"{scheme}://{host}:{port}/",
        ssl=client_tls() if tls else None,
        host="127.0.0.1",
        port=port,
        ping_interval=None,
        open_timeout=30,
        max_size=None,
    )


async def ws_client(port, host, count, interval_ms):
    """Keeps `count` WebSockets echoing a message every `interval_ms` each, with no keepalive and
    no reconnection (a reconnection would hide an interruption). Standard input drives it:
    `mark NAME` starts a new segment, `report` prints every segment's figures as JSON, `quit`
    ends. A segment counts messages sent, echoed, failed (a wrong echo, a timeout or a closed
    connection) and the slowest round trip."""
    conns = [await connect(port, host, True) for _ in range(count)]
    def segment(name):
        return {"name": name, "sent": 0, "echoed": 0, "failed": 0, "max_rtt_ms": 0.0,
                "errors": [], "started": time.monotonic()}

    segments = [segment("start")]
    alive = [True] * count

    async def run(i, ws):
        seq = 0
        while alive[i]:
            seg = segments[-1]
            text = f"{i}-{seq}"
            seq += 1
            seg["sent"] += 1
            start = time.monotonic()
            try:
                await ws.send(text)
                got = await asyncio.wait_for(ws.recv(), 10)
                rtt = (time.monotonic() - start) * 1000
                if got == text:
                    seg["echoed"] += 1
                    seg["max_rtt_ms"] = max(seg["max_rtt_ms"], rtt)
                else:
                    seg["failed"] += 1
                    seg["errors"].append(f"connection {i}: sent {text}, got {got!r}")
            except Exception as e:  # noqa: BLE001: every failure is reported, none hidden
                seg["failed"] += 1
                after = (time.monotonic() - seg["started"]) * 1000
                seg["errors"].append(
                    f"connection {i}: {type(e).__name__}: {e} ({after:.0f} ms after the mark)")
                alive[i] = False
                return
            await asyncio.sleep(interval_ms / 1000)

    tasks = [asyncio.create_task(run(i, ws)) for i, ws in enumerate(conns)]
    ready()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = (await reader.readline()).decode().strip()
        if line.startswith("mark "):
            segments.append(segment(line[5:]))
        elif line == "report":
            print(json.dumps({"alive": sum(alive), "segments": segments}), flush=True)
        elif line in ("quit", ""):
            break
    for i in range(count):
        alive[i] = False
    for t in tasks:
        t.cancel()


async def ws_idle(port, host, idle):
    """One WebSocket, a message, `idle` seconds of silence (no ping), a message: `alive` when the
    second is echoed, else how it ended."""
    ws = await connect(port, host, True)
    await ws.send("before")
    assert await asyncio.wait_for(ws.recv(), 10) == "before"
    start = time.monotonic()
    await asyncio.sleep(idle)
    try:
        await ws.send("after")
        got = await asyncio.wait_for(ws.recv(), 10)
        print("alive" if got == "after" else f"wrong {got!r}", flush=True)
    except Exception as e:  # noqa: BLE001
        code = getattr(getattr(e, "rcvd", None), "code", None)
        print(json.dumps({"closed": type(e).__name__, "close_frame": code,
                          "after_s": round(time.monotonic() - start, 1)}), flush=True)


async def ws_who(port, host, count):
    """Asks `count` new WebSockets which server answers them: the names, one line of JSON."""
    names = []
    for _ in range(count):
        ws = await connect(port, host, True)
        await ws.send("who")
        names.append(await asyncio.wait_for(ws.recv(), 10))
        await ws.close()
    print(json.dumps(names), flush=True)


async def ws_bench(port, host, tls, messages, size, connections):
    """Round trips of `messages` messages of `size` bytes over each of `connections`
    WebSockets, one in flight per connection: latency percentiles and throughput."""
    payload = "x" * size
    conns = [await connect(port, host, tls) for _ in range(connections)]
    rtts = []

    async def run(ws):
        for _ in range(messages):
            start = time.perf_counter()
            await ws.send(payload)
            got = await ws.recv()
            rtts.append(time.perf_counter() - start)
            assert len(got) == size

    start = time.perf_counter()
    await asyncio.gather(*(run(ws) for ws in conns))
    elapsed = time.perf_counter() - start
    rtts.sort()
    pct = lambda q: rtts[min(len(rtts) - 1, int(q * len(rtts)))] * 1e6  # noqa: E731
    print(json.dumps({"messages": len(rtts), "seconds": elapsed,
                      "messages_per_second": len(rtts) / elapsed,
                      "p50_us": pct(0.5), "p90_us": pct(0.9), "p95_us": pct(0.95),
                      "p99_us": pct(0.99), "max_us": rtts[-1] * 1e6}), flush=True)
    for ws in conns:
        await ws.close()


# --- Server-sent events ------------------------------------------------------------------------


def sse_server(port):
    """`GET /events?gap=S`: one event, S seconds of silence, a second event, the end."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlparse

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            gap = float(parse_qs(urlparse(self.path).query).get("gap", ["0"])[0])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i, event in enumerate([b"data: first\n\n", b"data: second\n\n"]):
                if i:
                    time.sleep(gap)
                try:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.flush()
                except OSError:
                    return
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    ready()
    server.serve_forever()


def sse_idle(port, host, gap):
    """An event stream through sozu whose second event comes after `gap` s: `alive` when both
    arrive, else what arrived."""
    import socket

    raw = socket.create_connection(("127.0.0.1", port), timeout=gap + 30)
    s = client_tls().wrap_socket(raw, server_hostname=host)
    s.sendall(f"GET /events?gap={gap} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n"
              "Connection: close\r\n\r\n".encode())
    got = b""
    start = time.monotonic()
    while b"data: second" not in got:
        try:
            chunk = s.recv(4096)
        except OSError as e:
            got += f"[{type(e).__name__}]".encode()
            break
        if not chunk:
            break
        got += chunk
    if b"data: first" in got and b"data: second" in got:
        print("alive", flush=True)
    else:
        print(json.dumps({"closed_after_s": round(time.monotonic() - start, 1),
                          "received": got.decode(errors="replace")[-200:]}), flush=True)


# --- gRPC --------------------------------------------------------------------------------------


def grpc_server(port):
    """`/echo.Echo/Say` (unary: the request back, or NOT_FOUND with a message for `missing`) and
    `/echo.Echo/Count` (server streaming: as many messages as the request's number), each with a
    trailer, over h2c on 127.0.0.1."""
    from concurrent import futures

    import grpc

    def say(request, context):
        context.set_trailing_metadata((("x-echo-trailer", "said"),))
        if request == b"missing":
            context.abort(grpc.StatusCode.NOT_FOUND, "no such greeting")
        return request

    def count(request, context):
        context.set_trailing_metadata((("x-echo-trailer", "counted"),))
        for i in range(int(request.decode())):
            yield f"message {i}".encode()

    handler = grpc.method_handlers_generic_handler("echo.Echo", {
        "Say": grpc.unary_unary_rpc_method_handler(say),
        "Count": grpc.unary_stream_rpc_method_handler(count),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    ready()
    server.wait_for_termination()


def grpc_client(port, host, cert_file):
    """Calls the three cases through sozu over TLS (h2 by ALPN) and prints what came back."""
    import grpc

    with open(cert_file, "rb") as f:
        root = f.read()
    creds = grpc.ssl_channel_credentials(root_certificates=root)
    options = (("grpc.ssl_target_name_override", host), ("grpc.default_authority", host))
    out = {}
    with grpc.secure_channel(f"127.0.0.1:{port}", creds, options=options) as channel:
        say = channel.unary_unary("/echo.Echo/Say")
        reply, call = say.with_call(b"hello", timeout=30)
        out["unary"] = reply.decode()
        out["unary_trailers"] = dict(call.trailing_metadata())
        out["unary_code"] = call.code().name
        stream = channel.unary_stream("/echo.Echo/Count")(b"5", timeout=30)
        out["stream"] = [m.decode() for m in stream]
        out["stream_trailers"] = dict(stream.trailing_metadata())
        out["stream_code"] = stream.code().name
        try:
            say(b"missing", timeout=30)
            out["error_code"] = "OK"
        except grpc.RpcError as e:
            out["error_code"] = e.code().name
            out["error_details"] = e.details()
            out["error_trailers"] = dict(e.trailing_metadata() or ())
    print(json.dumps(out), flush=True)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "check":
        import grpc  # noqa: F401
        import websockets  # noqa: F401
        print("ok")
    elif cmd == "ws-server":
        tls = None
        if "--tls" in args:
            i = args.index("--tls")
            tls, args = (args[i + 1], args[i + 2]), args[:i] + args[i + 3:]
        asyncio.run(ws_server(int(args[0]), args[2:] or ["127.0.0.1"], args[1], tls))
    elif cmd == "ws-client":
        asyncio.run(ws_client(int(args[0]), args[1], int(args[2]), int(args[3])))
    elif cmd == "ws-idle":
        asyncio.run(ws_idle(int(args[0]), args[1], float(args[2])))
    elif cmd == "ws-who":
        asyncio.run(ws_who(int(args[0]), args[1], int(args[2])))
    elif cmd == "ws-bench":
        asyncio.run(ws_bench(int(args[0]), args[1], args[2] == "tls", int(args[3]),
                             int(args[4]), int(args[5])))
    elif cmd == "sse-server":
        sse_server(int(args[0]))
    elif cmd == "sse-idle":
        sse_idle(int(args[0]), args[1], float(args[2]))
    elif cmd == "grpc-server":
        grpc_server(int(args[0]))
    elif cmd == "grpc-client":
        grpc_client(int(args[0]), args[1], args[2])
    else:
        sys.exit(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    main()
