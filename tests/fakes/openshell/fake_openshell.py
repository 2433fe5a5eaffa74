"""fake-openshell: a stand-in for an NVIDIA OpenShell gateway, for tests.

A gRPC server (grpcio, HTTP/2 over TLS, mutual TLS when given a client CA)
serving the calls a client makes for one run on the `openshell.v1.OpenShell`
service: GetGatewayInfo, CreateSandbox, GetSandbox, GetSandboxConfig,
ListSandboxes, DeleteSandbox, ExecSandbox and ExecSandboxInteractive. Its
messages are its own tables (messages.py), field numbers as OpenShell
publishes them; test_fake_openshell.py proves them by driving the fake
with the stubs in OpenShell's own Python package.

Sandboxes live in memory and move PROVISIONING -> READY. A create is
stored as the gateway stores it (an omitted main process becomes a login
shell on a terminal; fields these tables do not know are gone), and what
GetSandbox answers is that stored spec. Each sandbox is a real container
whose main process is the stored command: when it ends, the sandbox is
terminal, COMPLETED for exit 0 and ERROR otherwise, with the exit code.
Its network follows the stored policy: none when the policy has no
`network_policies` endpoint (OpenShell then denies every connection out),
a jail when it has some (its own network, whose only way out is an
explicit CONNECT proxy on its gateway that tunnels to the endpoints'
hosts at their ports, dialled where the `resolve` table says, and that
every process in the sandbox is pointed at by HTTPS_PROXY and the rest:
egress_proxy.py, network_policy.py and ../e2b/jail.py), and docker's
bridge network when the create sent no policy at all (README.md says
why). An exec runs the command in it for real as the sandbox user,
through bash as the gateway does (`bash -lc`, or `bash -c` with
`no_login_shell`), in `/sandbox` unless a working directory is given
(execs.py: stdin from the stream's frames, stdout and stderr as they
come, then the exit; a cancelled call kills the command's process
group). GetSandboxConfig answers the policy the sandbox was created with
and its hash, computed as the gateway computes it (policy_hash.py).
Requests are checked as the gateway checks them (a spec, a name, a
command, the workspace, a page), and the fake counts live sandboxes.
README.md says, field by field, what the gateway does and what the fake
does. Knobs (`KNOBS`) make it misbehave the ways a gateway can. It shares
the container runner, the knob table and the jails with fake-e2b.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "e2b"))
sys.path.insert(0, str(HERE))
import egress_proxy  # noqa: E402
import execs  # noqa: E402
import messages as m  # noqa: E402
import network_policy  # noqa: E402
from container import ContainerError, Docker  # noqa: E402
from faults import Faults  # noqa: E402
from forwarder import ResolveTable  # noqa: E402
from jail import DEFAULT_POOL, JailError, Jails  # noqa: E402
from policy_hash import policy_hash  # noqa: E402
from protowire import WireError, decode, encode  # noqa: E402
from sandbox_record import Sandbox  # noqa: E402

SERVICE = "openshell.v1.OpenShell"
DEFAULT_IMAGE = "plimsoll/sandbox:bookworm"
SANDBOX_USER = "user"  # the gateway's choice, not the client's
# What the gateway stores for an omitted main process, with a terminal.
SCRATCH_SHELL = ["/bin/bash", "-l"]
# The gateway's workspace root: an exec's directory when it names none.
# Here root's and not writable by the sandbox user (the least the adapter
# can live with: it writes only under /tmp).
WORKSPACE_ROOT = "/sandbox"
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,17}[a-z0-9])?$")

KNOBS: "dict[str, dict]" = {
    "driver_not_docker": {},            # the one compute driver is "podman"
    "two_drivers": {},                  # a second compute driver
    "policy_global": {},                # GetSandboxConfig: a GLOBAL policy source
    "proposals_on": {},                 # agent policy proposals enabled
    "readback_changed": {},             # GetSandbox reports a wider filesystem policy
    "config_not_admitted": {},          # configuration_admitted false
    "not_ready": {},                    # exec: FAILED_PRECONDITION "sandbox is not ready"
    "exec_timeout": {"seconds": 1},     # the gateway's own timeout: exit 124, process left running
    "delete_accepted": {"vanish_after": 1.0},  # ACCEPTED; the sandbox goes later
    "egress_open": {},                  # the sandbox gets a network whatever its policy
    "provisioning_reads": {"reads": 3},  # READY only after N reads
    "run_as_root": {},                  # the sandbox's commands run as root
    "stdout_flood": {"mib": 56},        # an exec streams this much stdout, never ending
    "main_process_swapped": {},         # the stored (and run) main process is the
                                        # login shell on a terminal, whatever was asked
    "main_process_killed": {},          # the main process is killed (SIGKILL) at create:
                                        # the sandbox is ERROR, exit code 137
}


class FakeOpenShell:
    def __init__(self, *, tls: "tuple[str, str]", client_ca: "str | None" = None,
                 bearer: "str | None" = None, image: str = DEFAULT_IMAGE,
                 docker: str = "docker", workspaces: "tuple[str, ...]" = ("default",),
                 resolve: "list[str] | None" = None, jail_pool: str = DEFAULT_POOL) -> None:
        self.tls, self.client_ca, self.bearer, self.image = tls, client_ca, bearer, image
        # The workspaces the gateway has; a test may add one.
        self.workspaces = set(workspaces)
        # What each create asked for: (workspace, the stored template).
        self.asked: "list[tuple[str, dict]]" = []
        self.instance_id = "fake-openshell-" + secrets.token_hex(6)
        self.docker = Docker(self.instance_id, docker)
        # Where a jail's proxy dials an allowed CONNECT (`NAME:PORT=HOST:PORT`
        # entries, curl's --resolve shape): the fake's stand-in for the DNS
        # OpenShell's supervisor resolves with.
        self.resolve = ResolveTable(resolve)
        self.jails = Jails(self.instance_id, self.resolve, pool=jail_pool, docker=docker)
        self.faults = Faults(KNOBS)
        self._lock = threading.Lock()
        self.sandboxes: "dict[str, Sandbox]" = {}
        self.counts = {"created": 0, "deleted": 0, "execs": 0, "cancelled": 0,
                       "config_reads": 0, "refused": 0}
        self.seen_auth: "list[str]" = []
        self.port = 0
        self._server: "grpc.Server | None" = None
        self._stopping = threading.Event()

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> "FakeOpenShell":
        # A dead fake's jails (its owner process gone) are swept first.
        self.swept = self.jails.sweep()
        raw = lambda b: b  # noqa: E731 - the fake decodes with its own tables
        unary = lambda f: grpc.unary_unary_rpc_method_handler(  # noqa: E731
            self._guard(f), request_deserializer=raw, response_serializer=raw)
        handlers = {
            "GetGatewayInfo": unary(self._gateway_info),
            "CreateSandbox": unary(self._create),
            "GetSandbox": unary(self._get),
            "GetSandboxConfig": unary(self._config),
            "ListSandboxes": unary(self._list),
            "DeleteSandbox": unary(self._delete),
            "ExecSandbox": grpc.unary_stream_rpc_method_handler(
                self._guard(self._exec_unary), request_deserializer=raw, response_serializer=raw),
            "ExecSandboxInteractive": grpc.stream_stream_rpc_method_handler(
                self._guard(self._exec_interactive), request_deserializer=raw,
                response_serializer=raw),
        }
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),))
        cert, key = (Path(p).read_bytes() for p in self.tls)
        creds = grpc.ssl_server_credentials(
            [(key, cert)],
            root_certificates=Path(self.client_ca).read_bytes() if self.client_ca else None,
            require_client_auth=self.client_ca is not None)
        self.port = self._server.add_secure_port("127.0.0.1:0", creds)
        self._server.start()
        threading.Thread(target=self._vanish_loop, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
        self.docker.remove_all()
        with self._lock:
            jails = [s.jail for s in self.sandboxes.values() if s.jail is not None]
        for jail in jails:
            jail.close()
        self.jails.remove_own()

    @property
    def origin(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def set_fault(self, name: str, count: "int | None" = 1, **params) -> None:
        self.faults.set(name, count, **params)

    def clear_faults(self) -> None:
        self.faults.clear()

    def live(self) -> "list[str]":
        with self._lock:
            return [s.name for s in self.sandboxes.values()]

    def state(self) -> dict:
        with self._lock:
            return {"live": [s.name for s in self.sandboxes.values()], **self.counts,
                    "faults": self.faults.snapshot(), "asked": list(self.asked),
                    "jails": {s.name: s.jail.describe() for s in self.sandboxes.values()
                              if s.jail is not None}}

    def plant(self, labels: "dict[str, str]") -> str:
        """A ready sandbox made by someone else, with these labels and no
        container; returns its name."""
        name = "planted-" + secrets.token_hex(4)
        s = Sandbox("sb-" + secrets.token_hex(8), name, labels, self._stored({}), "")
        s.pending_reads = 0
        with self._lock:
            self.sandboxes[name] = s
        return name

    def _vanish_loop(self) -> None:
        """Deletes that were ACCEPTED finish later."""
        while not self._stopping.wait(0.1):
            now = time.time()
            with self._lock:
                due = [s for s in self.sandboxes.values() if s.vanish_at and s.vanish_at <= now]
            for s in due:
                self._remove(s)

    def _remove(self, s: Sandbox) -> None:
        with self._lock:
            if self.sandboxes.pop(s.name, None) is None:
                return
            self.counts["deleted"] += 1
        for p in s.processes:
            p.kill()
        if s.container:
            self.docker.remove(s.container)
        if s.jail is not None:
            s.jail.close()  # after its container: rules, forwarder, network

    # ---- every call ----------------------------------------------------------------

    def _guard(self, handler):
        """Authentication as a gateway does it (the client certificate is
        checked by TLS; a bearer, when configured, in the metadata), and
        requests that do not decode refused as INVALID_ARGUMENT."""
        def call(request, context):
            md = dict(context.invocation_metadata())
            if self.bearer is not None and md.get("authorization") != f"Bearer {self.bearer}":
                with self._lock:
                    self.counts["refused"] += 1
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid bearer token is required")
            try:
                return handler(request, context)
            except WireError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {e}")
        return call

    def _workspace(self, req: dict, context) -> str:
        name = (req.get("workspace_scope") or {}).get("workspace")
        if not name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "workspace_scope must name a workspace")
        if name not in self.workspaces:
            context.abort(grpc.StatusCode.NOT_FOUND, "workspace not found")
        return name

    def _stored(self, asked: dict, *, swapped: bool = False) -> dict:
        """The spec as the gateway stores it at create: a copy with only the
        fields these tables know (a gateway that decodes the request into
        its own messages and rebuilds the sandbox from them keeps nothing
        else), an omitted command made the login shell on a terminal (a
        given command and its `tty` kept as sent), and an empty image made
        the default one."""
        spec = decode(m.SandboxSpec, encode(m.SandboxSpec, asked))
        if swapped or not spec.get("command"):
            spec["command"], spec["tty"] = list(SCRATCH_SHELL), True
        template = spec.setdefault("template", {})
        if not template.get("image"):
            template["image"] = self.image
        return spec

    def _watch(self, s: Sandbox) -> None:
        """Records how the sandbox's main process ended, when it does."""
        code = self.docker.wait(s.container)
        with self._lock:
            if code is not None and s.exit_code is None and self.sandboxes.get(s.name) is s:
                s.exit_code = code

    def _find(self, name: str, context) -> Sandbox:
        with self._lock:
            s = self.sandboxes.get(name)
        if s is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "sandbox not found")
        return s

    # ---- the calls ---------------------------------------------------------------------

    def _gateway_info(self, raw: bytes, context) -> bytes:
        def driver(name: str) -> dict:
            return {"name": name, "capabilities": {
                "driver_name": name, "driver_version": "fake",
                "resource_capabilities": {"cpu": {"limit_supported": True},
                                          "memory": {"limit_supported": True}}}}
        drivers = [driver("podman" if self.faults.take("driver_not_docker") is not None
                          else "docker")]
        if self.faults.take("two_drivers") is not None:
            drivers.append(driver("vm"))
        return encode(m.GetGatewayInfoResponse, {"status": 1, "gateway_version": "0.1.2-fake",
                                                 "compute_drivers": drivers})

    def _create(self, raw: bytes, context) -> bytes:
        req = decode(m.CreateSandboxRequest, raw)
        workspace = self._workspace(req, context)
        if "spec" not in req:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "spec is required")
        name = req.get("name", "")
        if not name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "name is required")
        if not _NAME.match(name):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "invalid sandbox name")
        with self._lock:
            if name in self.sandboxes:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, "sandbox already exists")
        spec = self._stored(req["spec"],
                            swapped=self.faults.take("main_process_swapped") is not None)
        with self._lock:
            self.asked.append((workspace, dict(spec.get("template") or {})))
        # The network follows the stored policy; egress_open is a gateway
        # whose enforcement is broken (the policy still reads back as sent).
        kind, found = network_policy.network_for(spec.get("policy"))
        if self.faults.take("egress_open") is not None:
            kind = "open"
        jail, network, proxy_env = None, {"open": "bridge"}.get(kind, "none"), {}
        try:
            if kind == "jail":
                # The sandbox's only way out is the proxy on its gateway;
                # it resolves nothing itself (no /etc/hosts entries).
                gate = network_policy.EndpointGate(found)
                jail = self.jails.open_serving(name, lambda gateway: egress_proxy.ConnectProxy(
                    gateway, gate.decide, self.resolve).start())
                network, proxy_env = jail.network, egress_proxy.environment(jail.gateway)
            # The stored command is the container's main process; like
            # OpenShell's entrypoint it starts with the proxy variables.
            container = self.docker.create(self.image, name, network=network, env=proxy_env,
                                           container_signs=True, main=spec["command"],
                                           tty=bool(spec.get("tty")))
        except (ContainerError, JailError) as e:
            if jail is not None:
                jail.close()
            context.abort(grpc.StatusCode.INTERNAL, f"the sandbox could not start: {e}")
        s = Sandbox("sb-" + secrets.token_hex(8), name, req.get("labels", {}), spec, container)
        s.jail, s.proxy_env = jail, proxy_env
        try:
            self.docker.make_dir(container, "root", WORKSPACE_ROOT)
            if jail is not None:
                # No resolver: an OpenShell sandbox has no DNS of its own
                # (its nft table rejects UDP and TCP to anything but the
                # proxy), and docker's embedded one would otherwise answer,
                # or forward, whatever the engine does for internal networks.
                self.docker.write_file(container, "root", "/etc/resolv.conf", b"")
        except ContainerError:
            pass  # the main process already ended; the sandbox is terminal
        if self.faults.take("run_as_root") is not None:
            s.flags.add("root")
        if knob := self.faults.take("provisioning_reads"):
            s.pending_reads = knob["reads"]
        # The create answers the sandbox as stored: provisioning.
        answer = encode(m.SandboxResponse, {"sandbox": s.to_message(m.PHASE["PROVISIONING"])})
        if self.faults.take("main_process_killed") is not None:
            self.docker.kill(container)
            s.exit_code = self.docker.wait(container)
        with self._lock:
            self.sandboxes[name] = s
            self.counts["created"] += 1
        if s.exit_code is None:
            threading.Thread(target=self._watch, args=(s,), daemon=True).start()
        return answer

    def _get(self, raw: bytes, context) -> bytes:
        req = decode(m.GetSandboxRequest, raw)
        self._workspace(req, context)
        s = self._find(req.get("name", ""), context)
        with self._lock:
            phase = s.phase(read=True)
        spec = None
        # The change shows once the sandbox is ready, where a client reads
        # it back.
        if phase == m.PHASE["READY"] and self.faults.take("readback_changed") is not None:
            spec = decode(m.SandboxSpec, encode(m.SandboxSpec, s.spec))
            fs = spec.setdefault("policy", {}).setdefault("filesystem", {})
            fs["read_write"] = list(fs.get("read_write", [])) + ["/"]
        return encode(m.SandboxResponse, {"sandbox": s.to_message(phase, spec)})

    def _config(self, raw: bytes, context) -> bytes:
        req = decode(m.GetSandboxConfigRequest, raw)
        self._workspace(req, context)
        s = self._find(req.get("name", ""), context)
        with self._lock:
            self.counts["config_reads"] += 1
        policy = s.spec.get("policy", {})
        proposals = {"key": "agent_policy_proposals_enabled",
                     "value": {"value": {"bool_value": self.faults.take("proposals_on") is not None},
                               "scope": 1}}
        source = ("GLOBAL" if self.faults.take("policy_global") is not None else "SANDBOX")
        admitted = self.faults.take("config_not_admitted") is None
        return encode(m.GetSandboxConfigResponse, {
            "policy": policy, "version": 1, "policy_hash": policy_hash(policy) or "",
            "settings": [proposals], "policy_source": m.POLICY_SOURCE[source],
            "workspace": "default", "configuration_admitted": admitted})

    def _list(self, raw: bytes, context) -> bytes:
        req = decode(m.ListSandboxesRequest, raw)
        self._workspace(req, context)
        if req.get("page_size", 0) < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "page_size must not be negative")
        size = min(req.get("page_size") or 100, 1000)
        selector = req.get("label_selector", "")
        # A token is bound to the request that produced it (all but the
        # page size): another selector with it is refused.
        bound = hashlib.sha256(selector.encode()).hexdigest()[:16]
        start = 0
        if token := req.get("page_token", ""):
            offset, _, tag = token.partition(".")
            if tag != bound or not offset.isdigit():
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              "page_token does not belong to this request")
            start = int(offset)
        wanted = dict(term.split("=", 1) for term in selector.split(",") if "=" in term)
        with self._lock:
            found = [s for s in self.sandboxes.values()
                     if all(s.labels.get(k) == v for k, v in wanted.items())]
            page = [s.to_message(s.phase()) for s in found[start:start + size]]
        more = start + size < len(found)
        return encode(m.ListSandboxesResponse, {
            "sandboxes": page,
            "next_page_token": f"{start + size}.{bound}" if more else ""})

    def _delete(self, raw: bytes, context) -> bytes:
        req = decode(m.DeleteSandboxRequest, raw)
        self._workspace(req, context)
        with self._lock:
            s = self.sandboxes.get(req.get("name", ""))
        if s is None:
            if not req.get("allow_missing"):
                context.abort(grpc.StatusCode.NOT_FOUND, "sandbox not found")
            return encode(m.DeleteSandboxResponse, {"outcome": m.DELETION["ALREADY_ABSENT"]})
        if knob := self.faults.take("delete_accepted"):
            s.vanish_at = time.time() + knob["vanish_after"]
            return encode(m.DeleteSandboxResponse, {"outcome": m.DELETION["ACCEPTED"],
                                                    "sandbox_id": s.id})
        self._remove(s)
        return encode(m.DeleteSandboxResponse, {"outcome": m.DELETION["COMPLETED"],
                                                "sandbox_id": s.id})

    # ---- exec ------------------------------------------------------------------------------

    def _exec_unary(self, raw: bytes, context):
        start = decode(m.ExecSandboxRequest, raw)
        stdin = iter([start.get("stdin", b"")] if start.get("stdin") else [])
        yield from self._exec(start, stdin, context)

    def _exec_interactive(self, requests, context):
        first = decode(m.ExecSandboxInput, next(requests, b""))
        if "start" not in first:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be start")

        def stdin():
            for raw in requests:
                frame = decode(m.ExecSandboxInput, raw)
                if "stdin" in frame:
                    yield frame["stdin"]
        yield from self._exec(first["start"], stdin(), context)

    def _exec(self, start: dict, stdin, context):
        self._workspace(start, context)
        command = start.get("command") or []
        if not command:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "command is required")
        s = self._find(start.get("sandbox", ""), context)
        if (s.phase() != m.PHASE["READY"]
                or self.faults.take("not_ready") is not None):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "sandbox is not ready")
        with self._lock:
            self.counts["execs"] += 1
        user = "root" if "root" in s.flags else SANDBOX_USER
        # As the gateway runs it (execs.py): one shell line through bash,
        # started in the workspace root, the sandbox's proxy variables
        # overriding the request's.
        proc = self.docker.spawn(s.container, "/bin/bash", execs.shell_args(start, s.proxy_env),
                                 user=user, cwd=WORKSPACE_ROOT, env={}, stdin=True)
        s.processes.append(proc)
        pid = int(proc.stdout.readline().strip() or 0)

        def kill():
            with self._lock:
                self.counts["cancelled"] += 1
            self.docker.signal(s.container, pid, 9)
            proc.kill()

        run = execs.Run(proc, stdin, kill)
        context.add_callback(run.cancel)
        if knob := self.faults.take("stdout_flood"):
            # A command that writes without end, as far as the client can
            # tell: the fake streams until the call is cancelled or the
            # amount is sent.
            chunk = encode(m.ExecSandboxEvent, {"stdout": {"data": b"y" * 65536}})
            for _ in range(knob["mib"] * 16):
                if not context.is_active():
                    return
                yield chunk
            return
        # The gateway's own timeout (the request's, or the knob's, whichever
        # is sooner); absent, none.
        limits = []
        if timeout := self.faults.take("exec_timeout"):
            limits.append(timeout["seconds"])
        if (given := start.get("execution_timeout")) is not None:
            limits.append(given.get("seconds", 0) + given.get("nanos", 0) / 1e9)
        yield from run.events(time.time() + min(limits) if limits else None)
