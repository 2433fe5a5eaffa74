"""envd, the agent inside each sandbox, behind E2B's edge.

The edge comes first: a request for a sandbox that does not exist (never
did, killed, timed out) answers 502 "The sandbox was not found", whatever the
path. Then envd: `/health` (open), the access token when the sandbox has one,
`/files` (plain HTTP, envd.yaml) and the Connect RPC services `process.Process`
and `filesystem.Filesystem` (process.proto, filesystem.proto).
"""

from __future__ import annotations

import base64
import gzip
import os
import queue
import time

import envd_messages as pb
from connect_protocol import (
    HTTP_STATUS, RpcError, codec_for, end_stream, envelope, parse_timeout_ms, read_envelope,
)
from container import DEFAULT_USER, USERS, ContainerError, resolve_path
from httpio import BadRequest, Exchange
from sandboxes import SANDBOX_GONE, Process, Registry, Sandbox

ENVD_PORT = 49983
# The edge's answer for a sandbox it does not know; the SDK keys on "was not found".
SANDBOX_NOT_FOUND = {"code": 502, "message": "The sandbox was not found"}
FLOOD_PID = 4_000_000  # the flood fault's process is synthetic; no real PID collides


class Envd:
    def __init__(self, registry: Registry, faults) -> None:
        self.registry, self.faults = registry, faults
        # envd requests that carried an X-API-Key: E2B's edge would forward
        # the header into the sandbox, where the guest could read it. No
        # client should send one; tests assert this stays 0.
        self.api_keys_seen = 0
        P, FS = "/process.Process/", "/filesystem.Filesystem/"
        # path -> (kind, request message, response message, handler)
        self.rpcs = {
            P + "Start": ("server", pb.StartRequest, pb.StartResponse, self.start),
            P + "Connect": ("server", pb.ConnectRequest, pb.ConnectResponse, self.connect),
            P + "List": ("unary", pb.ListRequest, pb.ListResponse, self.list),
            P + "SendInput": ("unary", pb.SendInputRequest, pb.Empty, self.send_input),
            P + "CloseStdin": ("unary", pb.CloseStdinRequest, pb.Empty, self.close_stdin),
            P + "SendSignal": ("unary", pb.SendSignalRequest, pb.Empty, self.send_signal),
            P + "StreamInput": ("client", pb.StreamInputRequest, pb.Empty, self.stream_input),
            FS + "Stat": ("unary", pb.PathRequest, pb.EntryResponse, self.stat),
            FS + "MakeDir": ("unary", pb.PathRequest, pb.EntryResponse, self.make_dir),
            FS + "ListDir": ("unary", pb.ListDirRequest, pb.ListDirResponse, self.list_dir),
            FS + "Remove": ("unary", pb.PathRequest, pb.Empty, self.remove),
            FS + "Move": ("unary", pb.MoveRequest, pb.EntryResponse, self.move),
        }
        # Methods the spec has and the fake does not serve: PTY resizing and
        # directory watching. They answer `unimplemented`, not 404.
        self.unimplemented = {P + "Update", FS + "WatchDir", FS + "CreateWatcher",
                              FS + "GetWatcherEvents", FS + "RemoveWatcher"}

    # ---- the edge, then envd's HTTP routes ------------------------------------------

    def serve(self, ex: Exchange, sandbox_id: str, port: int) -> None:
        sandbox = self.registry.get(sandbox_id)
        if sandbox is None or sandbox.state != "running" \
                or self.faults.take("envd_not_found") is not None:
            return ex.json(502, SANDBOX_NOT_FOUND)
        if port != ENVD_PORT:
            # Only envd is served; nothing else listens in a fake sandbox.
            return ex.json(502, {"code": 502, "message":
                                 f"The sandbox is running but port {port} is not open"})
        if ex.path == "/health":
            return ex.reply(204) if ex.method == "GET" else ex.json(405, _err(405, "use GET"))
        if ex.header("X-API-Key") is not None:
            self.api_keys_seen += 1
        # Public traffic locked at create: the edge wants the traffic token.
        if sandbox.traffic_token is not None and \
                ex.header("E2b-Traffic-Access-Token") != sandbox.traffic_token:
            return ex.json(403, _err(403, "the sandbox's traffic access token is required"))
        if sandbox.access_token is not None and \
                ex.header("X-Access-Token") != sandbox.access_token:
            return ex.json(401, _err(401, "unauthorized access, please provide a valid "
                                          "access token"))
        if ex.path == "/files":
            if ex.method == "GET":
                return self.download(ex, sandbox)
            if ex.method == "POST":
                return self.upload(ex, sandbox)
            return ex.json(405, _err(405, "use GET or POST"))
        if ex.path in self.rpcs or ex.path in self.unimplemented:
            return self.rpc(ex, sandbox)
        return ex.json(404, _err(404, f"no route {ex.path}"))

    # ---- /files ------------------------------------------------------------------------

    def _file_user(self, ex: Exchange) -> "str | None":
        user = ex.arg("username") or DEFAULT_USER
        return user if user in USERS else None

    def download(self, ex: Exchange, sandbox: Sandbox) -> None:
        user = self._file_user(ex)
        if user is None:
            return ex.json(401, _err(401, "invalid user"))
        if not ex.arg("path"):
            return ex.json(400, _err(400, "path is required"))
        path = resolve_path(ex.arg("path"), user)
        try:
            data = self.registry.docker.read_file(sandbox.container, user, path)
        except ContainerError as e:
            status = {"not_found": 404, "is_dir": 400}.get(e.kind, 500)
            message = {"not_found": f"file '{path}' not found",
                       "is_dir": f"path '{path}' is a directory"}.get(e.kind, e.message)
            return ex.json(status, _err(status, message))
        ex.reply(200, data, "application/octet-stream")

    def upload(self, ex: Exchange, sandbox: Sandbox) -> None:
        user = self._file_user(ex)
        if user is None:
            return ex.json(401, _err(401, "invalid user"))
        media = (ex.header("Content-Type") or "").split(";", 1)[0].strip().lower()
        body = ex.read_body()
        if (ex.header("Content-Encoding") or "").lower() == "gzip":
            try:
                body = gzip.decompress(body)
            except OSError:
                return ex.json(400, _err(400, "body is not valid gzip"))
        if media == "multipart/form-data":
            try:
                files = _multipart_files(ex.header("Content-Type"), body)
            except BadRequest as e:
                return ex.json(400, _err(400, str(e)))
            if ex.arg("path") and len(files) == 1:
                files = [(ex.arg("path"), files[0][1])]
        elif media == "application/octet-stream":
            files = [(ex.arg("path"), body)]
        else:
            return ex.json(400, _err(400, f"unsupported Content-Type {media!r}"))
        if self.faults.take("upload_dropped") is not None:
            return ex.json(200, [{"name": os.path.basename(n or ""), "type": "file",
                                  "path": n} for n, _ in files])
        written = []
        for name, data in files:
            if not name:
                return ex.json(400, _err(400, "path is required"))
            path = resolve_path(name, user)
            try:
                self.registry.docker.write_file(sandbox.container, user, path, data)
            except ContainerError as e:
                if e.kind == "is_dir":
                    return ex.json(400, _err(400, f"path '{path}' is a directory"))
                return ex.json(500, _err(500, e.message))
            written.append({"name": os.path.basename(path), "type": "file", "path": path})
        ex.json(200, written)

    # ---- Connect RPC -------------------------------------------------------------------

    def rpc(self, ex: Exchange, sandbox: Sandbox) -> None:
        if ex.method != "POST":
            return ex.json(405, _err(405, "RPCs are POST"))
        kind = self.rpcs[ex.path][0] if ex.path in self.rpcs else "unary"
        codec = codec_for(ex.header("Content-Type") or "")
        if codec is None or codec.streaming != (kind != "unary"):
            accepted = ("application/connect+json, application/connect+proto" if kind != "unary"
                        else "application/json, application/proto")
            return ex.reply(415, headers={"Accept-Post": accepted})
        try:
            deadline_s = parse_timeout_ms(ex.header("Connect-Timeout-Ms"))
            deadline = None if deadline_s is None else time.monotonic() + deadline_s
            encoding = ex.header("Connect-Content-Encoding" if codec.streaming
                                 else "Content-Encoding") or "identity"
            if encoding.lower() != "identity":
                raise RpcError("unimplemented", f"compression {encoding!r} is not supported")
            if ex.path in self.unimplemented:
                raise RpcError("unimplemented", f"{ex.path} is not implemented by fake-e2b")
            _, request_msg, response_msg, handler = self.rpcs[ex.path]
            user = _rpc_user(ex)
            if kind == "server":
                return handler(ex, codec, sandbox, user, deadline,
                               codec.decode(request_msg, _one_envelope(ex)))
            if kind == "client":
                return handler(ex, codec, sandbox)
            request = codec.decode(request_msg, ex.read_body())
            response = handler(sandbox, user, request)
            ex.reply(200, codec.encode(response_msg, response), codec.content_type)
        except RpcError as e:
            if not codec.streaming:
                return ex.json(HTTP_STATUS[e.code], e.to_json())
            # Streams answer 200 whatever happens; the error ends the stream.
            if not ex.answered:
                ex.stream_start(200, codec.content_type)
            ex.stream_write(end_stream(e))
            ex.stream_end()

    # ---- process.Process: streams ------------------------------------------------------

    def start(self, ex, codec, sandbox, user, deadline, request) -> None:
        config = request.get("process")
        if not config or not config.get("cmd"):
            raise RpcError("invalid_argument", "process.cmd is required")
        if "pty" in request:
            raise RpcError("unimplemented", "PTY processes are not implemented by fake-e2b")
        flood = self.faults.take("stdout_flood")
        if flood is not None:
            return self._flood(ex, codec, flood)
        cut = self.faults.take("start_cut") is not None
        cwd = resolve_path(config["cwd"], user) if config.get("cwd") else USERS[user]
        popen = self.registry.docker.spawn(sandbox.container, config["cmd"],
                                           config.get("args", []), user=user, cwd=cwd,
                                           env=config.get("envs", {}),
                                           stdin=bool(request.get("stdin", False)))
        pid = _read_pid(popen)
        if pid is None:
            detail = popen.stderr.read().decode(errors="replace").strip()
            popen.wait()
            raise RpcError("invalid_argument" if "chdir" in detail else "internal",
                           f"error starting process: {detail}")
        process = Process(sandbox, pid, config, request.get("tag"), user, popen,
                          bool(request.get("stdin", False)))
        events = process.subscribe()
        sandbox.add(process)
        process.run()
        self._stream(ex, codec, pb.StartResponse, process, events, deadline, cut)

    def connect(self, ex, codec, sandbox, user, deadline, request) -> None:
        process = _select(sandbox, request.get("process"))
        events = process.subscribe()
        if events is None:
            raise RpcError("not_found", f"process with pid {process.pid} not found")
        self._stream(ex, codec, pb.ConnectResponse, process, events, deadline, False)

    def _stream(self, ex, codec, response_msg, process, events, deadline, cut) -> None:
        """StartEvent, then what the process does, until its EndEvent; a
        deadline ends the stream (not the process), a client going away too."""
        interval = _keepalive_interval(ex)

        def send(event: dict) -> None:
            ex.stream_write(envelope(codec.encode(response_msg, {"event": event})))

        try:
            ex.stream_start(200, codec.content_type)
            send({"start": {"pid": process.pid}})
            while True:
                wait = interval
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        ex.stream_write(end_stream(RpcError("deadline_exceeded",
                                                            "the stream deadline passed")))
                        return ex.stream_end()
                    wait = left if wait is None else min(wait, left)
                try:
                    event = events.get(timeout=wait)
                except queue.Empty:
                    if interval is not None and (deadline is None or
                                                 deadline > time.monotonic()):
                        send({"keepalive": {}})
                    continue
                if event is SANDBOX_GONE:
                    ex.stream_write(end_stream(RpcError(
                        "unavailable", "the connection to the sandbox ended before the "
                                       "stream completed")))
                    return ex.stream_end()
                if "end" in event and cut:
                    return ex.abort()  # fault: the stream dies before its EndEvent
                send(event)
                if "end" in event:
                    ex.stream_write(end_stream())
                    return ex.stream_end()
        finally:
            process.unsubscribe(events)

    def _flood(self, ex, codec, flood: dict) -> None:
        """Fault: a command whose stdout is `bytes` long, in `chunk`-sized
        DataEvents, then exit 0. Nothing runs in the container."""
        def send(event: dict) -> None:
            ex.stream_write(envelope(codec.encode(pb.StartResponse, {"event": event})))

        ex.stream_start(200, codec.content_type)
        send({"start": {"pid": FLOOD_PID}})
        left, block = int(flood["bytes"]), b"x" * int(flood["chunk"])
        while left > 0:
            send({"data": {"stdout": block[:left]}})
            left -= len(block)
        send({"end": {"exit_code": 0, "exited": True, "status": "exit status 0"}})
        ex.stream_write(end_stream())
        ex.stream_end()

    def stream_input(self, ex: Exchange, codec, sandbox: Sandbox) -> None:
        """Client stream: a start event naming the process, then stdin data."""
        error, process = None, None
        try:
            while True:
                item = read_envelope(ex.read_exact)
                if item is None:
                    break
                message = codec.decode(pb.StreamInputRequest, item[1])
                if "start" in message:
                    process = _select(sandbox, message["start"].get("process"))
                elif "data" in message:
                    if process is None:
                        raise RpcError("failed_precondition", "no start event before data")
                    data = message["data"].get("input", {}).get("stdin")
                    if data is None:
                        raise RpcError("invalid_argument", "only stdin input is supported")
                    if not process.write_stdin(data):
                        raise RpcError("failed_precondition", "stdin is not open")
        except RpcError as e:
            error = e
        ex.stream_start(200, codec.content_type)
        if error is None:
            ex.stream_write(envelope(codec.encode(pb.Empty, {})))
        ex.stream_write(end_stream(error))
        ex.stream_end()

    # ---- process.Process: unary ----------------------------------------------------------

    def list(self, sandbox, user, request) -> dict:
        return {"processes": [p.info() for p in sandbox.processes()]}

    def send_input(self, sandbox, user, request) -> dict:
        process = _select(sandbox, request.get("process"))
        data = (request.get("input") or {}).get("stdin")
        if data is None:
            raise RpcError("invalid_argument", "only stdin input is supported")
        if not process.write_stdin(data):
            raise RpcError("failed_precondition", "stdin is not open for this process")
        return {}

    def close_stdin(self, sandbox, user, request) -> dict:
        process = _select(sandbox, request.get("process"))
        if not process.close_stdin() and process.popen.stdin is None:
            raise RpcError("failed_precondition", "the process was started without stdin")
        return {}

    def send_signal(self, sandbox, user, request) -> dict:
        process = _select(sandbox, request.get("process"))
        signum = request.get("signal", 0)
        if signum not in (9, 15):
            raise RpcError("invalid_argument", f"unsupported signal {signum}")
        process.signal_sent = signum
        self.registry.docker.signal(sandbox.container, process.pid, signum)
        return {}

    # ---- filesystem.Filesystem -------------------------------------------------------------

    def stat(self, sandbox, user, request) -> dict:
        path = resolve_path(request.get("path", ""), user)
        return {"entry": _fs(self.registry.docker.stat, sandbox.container, user, path)}

    def make_dir(self, sandbox, user, request) -> dict:
        docker, path = self.registry.docker, resolve_path(request.get("path", ""), user)
        _fs(docker.make_dir, sandbox.container, user, path)
        return {"entry": _fs(docker.stat, sandbox.container, user, path)}

    def list_dir(self, sandbox, user, request) -> dict:
        path = resolve_path(request.get("path", ""), user)
        depth = request.get("depth") or 1
        return {"entries": _fs(self.registry.docker.list_dir, sandbox.container, user, path,
                               depth)}

    def remove(self, sandbox, user, request) -> dict:
        path = resolve_path(request.get("path", ""), user)
        _fs(self.registry.docker.remove_path, sandbox.container, user, path)
        return {}

    def move(self, sandbox, user, request) -> dict:
        docker = self.registry.docker
        source = resolve_path(request.get("source", ""), user)
        destination = resolve_path(request.get("destination", ""), user)
        _fs(docker.move, sandbox.container, user, source, destination)
        return {"entry": _fs(docker.stat, sandbox.container, user, destination)}


# ---- helpers ---------------------------------------------------------------------------

def _err(code: int, message: str) -> dict:
    return {"code": code, "message": message}


def _rpc_user(ex: Exchange) -> str:
    """The user an RPC acts as: `Authorization: Basic base64("<user>:")`."""
    header = ex.header("Authorization")
    if not header:
        return DEFAULT_USER
    scheme, _, value = header.partition(" ")
    try:
        user = base64.b64decode(value.strip()).decode().split(":", 1)[0]
    except ValueError:
        user = None
    if scheme.lower() != "basic" or user not in USERS:
        raise RpcError("unauthenticated", "invalid user")
    return user


def _one_envelope(ex: Exchange) -> bytes:
    item = read_envelope(ex.read_exact)
    if item is None:
        raise RpcError("invalid_argument", "a server-streaming call needs one request message")
    if ex.read_body():  # also consumes the end of a chunked body, for keep-alive
        raise RpcError("invalid_argument", "a server-streaming call takes one request message")
    return item[1]


def _select(sandbox: Sandbox, selector: "dict | None") -> Process:
    selector = selector or {}
    if "pid" in selector:
        found, what = sandbox.find(pid=selector["pid"]), f"pid {selector['pid']}"
    elif "tag" in selector:
        found, what = sandbox.find(tag=selector["tag"]), f"tag {selector['tag']!r}"
    else:
        raise RpcError("invalid_argument", "a process selector (pid or tag) is required")
    if found is None:
        raise RpcError("not_found", f"process with {what} not found")
    return found


def _read_pid(popen) -> "int | None":
    """The wrapper's first stdout line, read a byte at a time so that no
    output after it is taken from the pipe."""
    fd, line = popen.stdout.fileno(), b""
    while not line.endswith(b"\n") and len(line) < 32:
        byte = os.read(fd, 1)
        if not byte:
            return None
        line += byte
    return int(line) if line.strip().isdigit() else None


def _keepalive_interval(ex: Exchange) -> "float | None":
    value = ex.header("Keepalive-Ping-Interval")
    return float(value) if value and value.strip().isdigit() and int(value) > 0 else None


def _fs(operation, *args):
    """A filesystem operation in the container, its failure as an RPC error."""
    try:
        return operation(*args)
    except ContainerError as e:
        code = {"not_found": "not_found", "exists": "already_exists",
                "is_dir": "invalid_argument", "not_dir": "invalid_argument",
                "timeout": "deadline_exceeded"}.get(e.kind)
        if code is None:
            code = "permission_denied" if "ermission denied" in e.message else "internal"
        raise RpcError(code, e.message or code.replace("_", " "))


def _multipart_files(content_type: str, body: bytes) -> "list[tuple[str, bytes]]":
    """The `file` parts of a multipart/form-data body: (filename, content)."""
    boundary = None
    for param in content_type.split(";")[1:]:
        key, _, value = param.strip().partition("=")
        if key.lower() == "boundary":
            boundary = value.strip('"')
    if not boundary:
        raise BadRequest("multipart body without a boundary")
    files = []
    for part in body.split(b"--" + boundary.encode())[1:]:
        if part.startswith(b"--"):
            break  # the closing delimiter
        head, sep, content = part.partition(b"\r\n\r\n")
        if not sep:
            raise BadRequest("malformed multipart part")
        if content.endswith(b"\r\n"):
            content = content[:-2]
        disposition = {}
        for line in head.decode("utf-8", "replace").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-disposition":
                for item in value.split(";")[1:]:
                    key, _, val = item.strip().partition("=")
                    disposition[key.lower()] = val.strip('"').replace('\\"', '"').replace(
                        "%22", '"')
        if disposition.get("name") == "file":
            files.append((disposition.get("filename", ""), content))
    if not files:
        raise BadRequest('no "file" part in the multipart body')
    return files
