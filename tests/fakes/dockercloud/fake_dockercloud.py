"""fake-dockercloud: a stand-in for Docker's hosted sandboxes, for tests.

It serves, over HTTPS on loopback, the three things a client of Docker's
Sandboxes REST API (v1) talks to: Docker Hub's token exchange
(`POST /v2/auth/token`), the management API under `/sandboxes/v1`, and each
sandbox's endpoint under `/endpoints/<uid>/v1` (named in the sandbox's
`core.endpoint.uri` at a second host name, `localhost`, so a client can keep
the two origins apart). Each sandbox is a real container (docker's
marker file removed, like fake-e2b's) whose network follows its effective
network policy, decided at the create: deny-all with no allow rule (the
fail-closed default when the create asks for nothing) is `--network none`;
an allow rule, or allow-all, is docker's bridge network. Every exec runs
the command in it for real. The create's start argv is the
container's main process; when it ends, the sandbox has failed.

Every request is checked against the shapes Docker publishes (shapes.py)
and so is every answer the fake gives; a mismatch is recorded in
`state()["violations"]` and a request that breaks its shape is refused the
way the API refuses it (400 invalidArgument). Rules the document states
beyond shapes are enforced too: a management call needs a bearer the
exchange issued and not yet expired; the endpoint takes only a scoped
credential minted for that sandbox, and only for the operations its
permissions cover (a management token there is refused and counted); a
delete needs the sandbox's current ETag in `If-Match` (absent 428, stale
412, `*` refused), answers 202 with the deleting sandbox, which disappears
a moment later, and 204 for an absent one; an `Idempotency-Key` replays
the first answer to its create; the timeout's clock starts when the sandbox
first runs; an unknown route answers a non-JSON 404. Where the document
leaves a choice open the fake takes the one least convenient for a client
(README.md, "What Docker documents and what the fake does"). Knobs (`KNOBS`)
make it misbehave the ways the real service can. It shares the HTTP
plumbing, the container runner, the certificates and the knob table with
fake-e2b.
"""

from __future__ import annotations

import base64
import datetime as _dt
import ipaddress
import itertools
import json
import platform as _platform
import posixpath
import re
import secrets
import subprocess
import sys
import threading
import time
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from urllib.parse import parse_qs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2b"))
import shapes  # noqa: E402
from container import ContainerError, Docker  # noqa: E402
from fake_e2b import _Handler, _Server, _TlsServer  # noqa: E402
from faults import Faults  # noqa: E402
from httpio import Exchange  # noqa: E402

DEFAULT_IMAGE = "plimsoll/sandbox:bookworm"
# What the service's own capture keeps of an exec's output (both streams).
EXEC_CAPTURE = 4 << 20
TOKEN_TTL = 900
# A list's page when none is asked for, and the most one page holds: a
# larger pageSize is cut to it (the document leaves both to the backend).
LIST_PAGE = 50
# The initial TTL when a create enables timeouts but names none (the
# document says "the advertised action default"; nothing here advertises one).
DEFAULT_TIMEOUT = "300s"
# How long, at least, a deleted sandbox still reads as deleting.
DELETING_SECONDS = 0.3
# The operations the endpoint serves, by their operation IDs.
CAPABILITIES = ["download", "exec", "upload"]
# What each endpoint operation needs the credential to grant.
NEEDS = {"exec": "sandboxesExec", "upload": "sandboxesFilesWrite",
         "download": "sandboxesFilesRead"}
# Platforms the fake places a sandbox on (its containers run on this host).
PLATFORMS = {("linux", "amd64"), ("linux", "arm64")}
PLACED = {"os": "linux",
          "architecture": {"aarch64": "arm64", "arm64": "arm64"}.get(_platform.machine(), "amd64")}
LIST_FIELDS = ("name", "display_name", "uid", "status", "agent")
# The most nodes an exact policy view may hold (ExactNetworkPolicy.nodes).
EXACT_NODES = 256
_DNS_NAME = re.compile(r"^([a-z0-9]([a-z0-9-]*[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]*[a-z0-9])?$")

KNOBS: "dict[str, dict]" = {
    "token_refused": {},                 # the exchange answers 401
    "token_ttl": {"seconds": 61},        # the exchange issues short-lived tokens
    "create_429": {"retry_after": 1},    # create refused, quota full, nothing made
    "create_202": {"polls": 2},          # 202 creating, running after N reads
    "create_failed": {},                 # the sandbox ends in status failed
    "wrong_display_name": {},            # the sandbox reports another name
    "bigger_size": {},                   # reports more memory than asked for
    "endpoint_no_exec": {},              # the endpoint does not list exec
    "read_429": {"retry_after": 1},      # a GET answers 429 + Retry-After
    "mint_429": {"retry_after": 1},      # a credential mint answers 429
    "policy_allow_all": {},              # the created sandbox's policy is allowAll (open)
    "policy_extra_rule": {"network": "example.com"},  # one org allow rule in force (open)
    "upload_short": {},                  # the last file is not written
    "exec_incomplete": {},               # the service's capture dropped output
    "download_cut": {},                  # the answer stops before its closing delimiter
    "download_stream_error": {},         # a stream-error part
    "delete_stale": {},                  # the first DELETE finds the ETag stale
    "container_signs": {},               # the sandbox shows a container's marker
    "egress_open": {},                   # the sandbox gets a network; its policy still denies
    "exec_ignores_workdir": {},          # an exec that names a workingDir runs in /
    "delete_204": {},                    # the delete finishes at once: 204, gone
}

# Exit statuses of the small in-container file scripts below (and one for a
# path refused before any script runs), and the download error each means.
_ABSENT, _NOT_REGULAR, _NO_PARENT, _NOT_CANONICAL = 44, 45, 46, -1
_FILE_FAILURES = {
    _ABSENT: ("notFound", "no such file"),
    _NOT_REGULAR: ("failedPrecondition", "path_authority_nonregular_object: not a regular file"),
    _NOT_CANONICAL: ("invalidArgument", "not a canonical absolute path"),
}


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _now() -> str:
    return _stamp(time.time())


def _stamp(epoch: float) -> str:
    when = _dt.datetime.fromtimestamp(epoch, _dt.timezone.utc)
    return when.isoformat().replace("+00:00", "Z")


def _seconds(duration: str) -> float:
    return float(duration[:-1])


def _canonical(path: str) -> bool:
    """An absolute path with no `.`, `..`, empty or trailing part."""
    return (path.startswith("/") and not path.startswith("//")
            and posixpath.normpath(path) == path)


_SEQUENCE = itertools.count(1)


def _destination(network: str) -> "dict | None":
    """An allow or deny entry as an exact destination (destination.v1):
    an IP, a CIDR or a DNS name; None for anything else."""
    try:
        net = ipaddress.ip_network(network, strict=False)
    except ValueError:
        name = network.lower()
        return {"kind": "dns", "value": name} if _DNS_NAME.match(name) else None
    if "/" in network:
        return {"kind": "cidr", "value": str(net)}
    return {"kind": "ip", "value": str(net.network_address)}


class Policy:
    """A sandbox's effective network policy after layering: the mode and
    the allow and deny rules in force, each with the layer it came from and
    that layer's source."""

    ORIGINS = {"org": "organization", "attached": "attached"}

    def __init__(self, mode: str = "denyAll") -> None:
        self.mode = mode
        self.allow: "list[tuple[str, str, str]]" = []  # (network, layer, source id)
        self.deny: "list[tuple[str, str, str]]" = []

    @property
    def open(self) -> bool:
        """Whether the container gets a network: the fake cannot enforce
        a rule per destination, so any way out opens all of them."""
        return self.mode == "allowAll" or bool(self.allow)

    def nodes(self) -> "list[dict]":
        """The exact view: the mode's constant, any of it and each allowed
        destination, all of that and not each denied one; the last is the
        root."""
        deny_all = self.mode == "denyAll"
        nodes: "list[dict]" = [{"constant": "false" if deny_all else "true", "source": (
            {"origin": "default", "id": "deny-all"} if deny_all
            else {"origin": "organization", "id": "allow-all"})}]
        root = 0

        def leaf(rule: "tuple[str, str, str]") -> int:
            network, layer, source = rule
            nodes.append({"destination": _destination(network),
                          "source": {"origin": self.ORIGINS[layer], "id": source}})
            return len(nodes) - 1

        if self.allow:
            allowed = [root] + [leaf(rule) for rule in self.allow]
            nodes.append({"any": {"nodes": allowed}})
            root = len(nodes) - 1
        if self.deny:
            denied = []
            for rule in self.deny:
                nodes.append({"not": leaf(rule)})
                denied.append(len(nodes) - 1)
            nodes.append({"all": {"nodes": [root] + denied}})
        return nodes

    def answer(self, revision: int) -> dict:
        effective: dict = {"mode": self.mode, "allowNetworks": [
            {"network": n, "layer": layer} for n, layer, _ in self.allow]}
        if self.deny:
            effective["denyNetworks"] = [{"network": n, "layer": layer}
                                         for n, layer, _ in self.deny]
        return {"effective": effective,
                "exact": {"revision": str(revision), "selectorVersion": "destination.v1",
                          "nodes": self.nodes()}}


class Sandbox:
    def __init__(self, uid: str, request: dict, container: str, endpoint: str) -> None:
        self.uid, self.request, self.container = uid, request, container
        self.endpoint = endpoint
        self.seq = next(_SEQUENCE)  # creation order, for listing
        self.display_name = request.get("displayName", "")
        self.created_at = _now()
        self.revision = 1
        self.status = "running"
        self.pending_reads = 0
        self.failure: "dict | None" = None
        # token -> (expiry, the permissions it grants)
        self.credentials: "dict[str, tuple[float, frozenset]]" = {}
        self.labels = dict(request.get("labels") or {})
        self.flags: "set[str]" = set()
        # The effective network policy, decided at the create: what the
        # policy read answers and what the container's network follows.
        self.policy = Policy()
        # Omitted: the platform the sandbox was placed on, this host's.
        self.platform = dict(request.get("platform") or PLACED)
        timeouts = (request.get("features") or {}).get("timeouts")
        # The accepted initial TTL (None: no deadline feature), and the
        # deadline, armed only once the sandbox first runs.
        self.timeout = None if timeouts is None else (timeouts.get("timeout") or DEFAULT_TIMEOUT)
        self.auto_resume = bool((timeouts or {}).get("autoResume"))
        self.expires: "float | None" = None

    def arm(self) -> None:
        """First readiness: the deadline starts now (once)."""
        if self.timeout is not None and self.expires is None:
            self.expires = time.time() + _seconds(self.timeout)

    def fail(self, code: str, message: str) -> None:
        self.status, self.revision = "failed", self.revision + 1
        self.failure, self.expires = {"code": code, "message": message, "details": []}, None

    @property
    def etag(self) -> str:
        return f'"{self.uid}-r{self.revision}"'


class FakeDockerCloud:
    def __init__(self, username: str, pat: str, *, tls: "tuple[str, str]",
                 image: str = DEFAULT_IMAGE, docker: str = "docker",
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.username, self.pat = username, pat
        self.tls, self.host, self.port = tls, host, port
        self.image, self.verbose = image, False
        self.instance_id = "fake-dockercloud-" + secrets.token_hex(6)
        self.docker = Docker(self.instance_id, docker)
        self.faults = Faults(KNOBS)
        self._lock = threading.Lock()
        self.sandboxes: "dict[str, Sandbox]" = {}
        # key -> (body, status, answer, etag): the first result, replayed as it was
        self.idempotency: "dict[str, tuple[str, int, dict, str]]" = {}
        self.page_tokens: "set[str]" = set()
        self.tokens: "dict[str, float]" = {}                 # management JWT -> expiry
        self.counts = {"created": 0, "deleted": 0, "exchanges": 0, "mints": 0,
                       "execs": 0, "management_token_on_endpoint": 0,
                       "policy_reads": 0, "ttl_reaped": 0}
        self.violations: "list[str]" = []
        # What each create asked for: (imageRef, cpus, memoryMib).
        self.asked: "list[tuple]" = []
        self.secrets_seen_on_endpoint: "list[str]" = []
        self._server = self._exchange_server = None
        self.exchange_port = 0
        self._stopping = threading.Event()

    # ---- lifecycle ------------------------------------------------------------

    def start(self) -> "FakeDockerCloud":
        import ssl
        handler = type("Handler", (_Handler,), {"fake": self, "server_version": "fake-dockercloud"})
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*self.tls)
        context.set_alpn_protocols(["http/1.1"])
        server = type("Server", (_TlsServer,), {"context": context})
        self._server = server((self.host, self.port), handler)
        # Docker Hub's exchange is another origin than the API: a listener
        # of its own, which serves nothing else.
        self._exchange_server = server((self.host, 0), handler)
        for srv in (self._server, self._exchange_server):
            srv.daemon_threads = True
            threading.Thread(target=srv.serve_forever, daemon=True,
                             name="fake-dockercloud-http").start()
        self.port = self._server.server_address[1]
        self.exchange_port = self._exchange_server.server_address[1]
        threading.Thread(target=self._reap_expired, daemon=True,
                         name="fake-dockercloud-ttl").start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        for srv in (self._server, self._exchange_server):
            if srv is not None:
                srv.shutdown()
                srv.server_close()
        self._server = self._exchange_server = None
        self.docker.remove_all()

    @property
    def api_origin(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def endpoint_origin(self) -> str:
        return f"https://localhost:{self.port}"

    @property
    def exchange_url(self) -> str:
        return f"https://127.0.0.1:{self.exchange_port}/v2/auth/token"

    def _handled(self, began: float, ended: float) -> None:
        pass

    def set_fault(self, name: str, count: "int | None" = 1, **params) -> None:
        self.faults.set(name, count, **params)

    def clear_faults(self) -> None:
        self.faults.clear()

    def live(self) -> "list[str]":
        with self._lock:
            return list(self.sandboxes)

    def state(self) -> dict:
        with self._lock:
            return {"live": list(self.sandboxes), **self.counts,
                    "violations": list(self.violations), "asked": list(self.asked),
                    "faults": self.faults.snapshot()}

    def plant(self, labels: "dict[str, str]") -> str:
        """A sandbox made by someone else (another instance, a crashed
        daemon), with these labels and no container; returns its uid."""
        uid = secrets.token_hex(10)
        s = Sandbox(uid, {"displayName": f"planted-{uid[:6]}", "labels": labels,
                          "resources": {"cpus": 1, "memoryMib": 2048}}, "",
                    f"{self.endpoint_origin}/endpoints/{uid}")
        s.arm()
        with self._lock:
            self.sandboxes[uid] = s
        return uid

    def _reap_expired(self) -> None:
        """The service's backstop: a sandbox past its armed deadline is
        deleted (onTimeout delete, the only action the fake takes)."""
        while not self._stopping.wait(0.5):
            now = time.time()
            with self._lock:
                expired = [s for s in self.sandboxes.values()
                           if s.expires is not None and now > s.expires]
            for s in expired:
                self._remove(s, reaped=True)

    def _remove(self, s: Sandbox, reaped: bool = False) -> None:
        with self._lock:
            if self.sandboxes.get(s.uid) is not s:
                return
            del self.sandboxes[s.uid]
            self.counts["deleted"] += 1
            self.counts["ttl_reaped"] += reaped
        if s.container:
            self.docker.remove(s.container)

    def _finish_delete(self, s: Sandbox) -> None:
        """A delete's work: the container goes, then (no sooner than
        DELETING_SECONDS after the delete) the sandbox."""
        began = time.time()
        if s.container:
            self.docker.remove(s.container)
        time.sleep(max(0.0, began + DELETING_SECONDS - time.time()))
        with self._lock:
            if self.sandboxes.get(s.uid) is s:
                del self.sandboxes[s.uid]
                self.counts["deleted"] += 1

    def _watch(self, s: Sandbox) -> None:
        """The start argv is the sandbox's main process: when it ends, the
        sandbox has failed (nothing restarts it)."""
        code = self.docker.wait(s.container)
        with self._lock:
            if self.sandboxes.get(s.uid) is s and s.status in ("creating", "running"):
                s.fail("aborted", f"the sandbox's main process exited (status {code})")

    # ---- answers, each checked against the published shapes -----------------------

    def _check(self, what: str, schema: dict, value) -> "list[str]":
        found = shapes.problems(schema, value)
        if found:
            with self._lock:
                self.violations.extend(f"{what}: {p}" for p in found)
        return found

    def _answer(self, ex: Exchange, status: int, schema: "dict | None", body,
                headers: "dict[str, str] | None" = None) -> None:
        if schema is not None:
            self._check(f"answer {ex.method} {ex.path} {status}", schema, body)
        ex.json(status, body, headers)

    def _error(self, ex: Exchange, status: int, code: str, message: str,
               headers: "dict[str, str] | None" = None, reason: "str | None" = None) -> None:
        body = {"code": code, "message": message, "details": []}
        if reason:
            body["details"].append({"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                    "reason": reason})
        self._answer(ex, status, shapes.ERROR, body, headers)

    def _request_json(self, ex: Exchange, schema: dict):
        try:
            body = json.loads(ex.read_body() or b"null")
        except ValueError:
            self._error(ex, 400, "invalidArgument", "the body is not JSON")
            return None
        found = self._check(f"request {ex.method} {ex.path}", schema, body)
        if found:
            self._error(ex, 400, "invalidArgument", "; ".join(found)[:500])
            return None
        return body

    # ---- routing ----------------------------------------------------------------------

    def _route(self, ex: Exchange) -> None:
        path = ex.path
        if ex._h.server is self._exchange_server:
            if path == "/v2/auth/token" and ex.method == "POST":
                return self._exchange(ex)
            return ex.reply(404, b"<html><body>404 page not found</body></html>", "text/html")
        if path == "/_fake/state":
            return ex.json(200, self.state())
        if path.startswith("/sandboxes/v1/"):
            if not self._management_bearer(ex):
                return self._error(ex, 401, "unauthenticated", "a valid bearer is required")
            return self._management(ex, path[len("/sandboxes/v1"):])
        if path.startswith("/endpoints/"):
            uid, _, rest = path[len("/endpoints/"):].partition("/")
            return self._endpoint(ex, uid, "/" + rest)
        # A route the service does not serve: a proxy's page, not the API's JSON.
        ex.reply(404, b"<html><body>404 page not found</body></html>", "text/html")

    def _bearer(self, ex: Exchange) -> "str | None":
        auth = ex.header("Authorization") or ""
        return auth[len("Bearer "):] if auth.startswith("Bearer ") else None

    def _management_bearer(self, ex: Exchange) -> bool:
        token = self._bearer(ex)
        with self._lock:
            expiry = self.tokens.get(token or "")
        return expiry is not None and time.time() < expiry

    # ---- Docker Hub's token exchange ---------------------------------------------------

    def _exchange(self, ex: Exchange) -> None:
        body = self._request_json(ex, shapes.TOKEN_EXCHANGE_REQUEST)
        if body is None:
            return
        with self._lock:
            self.counts["exchanges"] += 1
        if (self.faults.take("token_refused") is not None or body["identifier"] != self.username
                or body["secret"] != self.pat):
            return ex.json(401, {"detail": "incorrect username or password"})
        short = self.faults.take("token_ttl")
        ttl = short["seconds"] if short else TOKEN_TTL
        exp = int(time.time()) + ttl
        token = ".".join([_b64url(b'{"alg":"RS256","typ":"JWT"}'),
                          _b64url(json.dumps({"sub": self.username, "exp": exp,
                                              "jti": secrets.token_hex(8)}).encode()),
                          _b64url(secrets.token_bytes(32))])
        with self._lock:
            self.tokens[token] = exp
        ex.json(200, {"access_token": token})

    # ---- management ------------------------------------------------------------------------

    def _management(self, ex: Exchange, path: str) -> None:
        parts = [p for p in path.split("/") if p]
        if ex.method == "GET" and (knob := self.faults.take("read_429")):
            return self._error(ex, 429, "resourceExhausted", "slow down",
                               {"Retry-After": str(knob["retry_after"])})
        if parts == ["sandboxes"] and ex.method == "POST":
            return self._create(ex)
        if parts == ["sandboxes"] and ex.method == "GET":
            return self._list(ex)
        if len(parts) >= 2 and parts[0] == "sandboxes":
            with self._lock:
                s = self.sandboxes.get(parts[1])
            rest = parts[2:]
            if rest == [] and ex.method == "GET":
                return self._get(ex, s)
            if rest == [] and ex.method == "DELETE":
                return self._delete(ex, s, parse_qs(ex.raw_query))
            if s is None:
                return self._error(ex, 404, "notFound", "sandbox not found")
            if rest == ["network-policies"] and ex.method == "GET":
                return self._policies(ex, s)
            if rest == ["endpoint-credentials"] and ex.method == "POST":
                return self._mint(ex, s)
        ex.reply(404, b"404 page not found", "text/plain")

    def _sandbox_json(self, s: Sandbox) -> dict:
        req = s.request
        capabilities = [c for c in CAPABILITIES if not (c == "exec" and "no_exec" in s.flags)]
        core = {"status": s.status, "createdAt": s.created_at, "etag": s.etag,
                "platform": s.platform, "labels": s.labels}
        # Present only when chosen: the fake chooses no size of its own.
        if req.get("resources"):
            resources = dict(req["resources"])
            if resources.get("memoryMib") is not None:
                # 64-bit integers travel as strings, as the document says.
                resources["memoryMib"] = str(int(resources["memoryMib"])
                                             * (2 if "bigger" in s.flags else 1))
            core["resources"] = resources
        if "imageRef" in req:
            core["imageRef"] = req["imageRef"]
        if s.status == "running":
            core["endpoint"] = {
                "uri": s.endpoint, "protocol": "http", "credentialAudience": "sandbox-endpoint",
                "sandbox": f"sandboxes/{s.uid}", "sandboxUid": s.uid, "apiVersion": "v1",
                "capabilities": capabilities,
                "authentication": {"scheme": "scopedBearer", "defaultTtl": "300s",
                                   "maxTtl": "300s"}}
        features: dict = {"lifecycle": {"stopMemoryOutcome": "discard",
                                        "canCaptureMemory": False},
                          "outputRetention": {"minBytes": "65536"}}
        if s.timeout is not None:
            timeouts = {"onTimeout": "delete", "autoResume": s.auto_resume,
                        "initialTimeout": s.timeout, "resumeTimeout": s.timeout}
            if s.expires is not None and s.status == "running":
                timeouts["expiresAt"] = _stamp(s.expires)
            features["timeouts"] = timeouts
        out = {"uid": s.uid, "name": f"sandboxes/{s.uid}", "core": core,
               "displayName": "someone-else" if "wrong_name" in s.flags else s.display_name,
               "effectiveFeatures": features}
        if s.status == "failed" and s.failure:
            out["failure"] = s.failure
        return out

    def _refusal(self, body: dict) -> "str | None":
        """What in a well-shaped create the fake refuses, and why."""
        platform = body.get("platform")
        if platform and (platform["os"], platform["architecture"]) not in PLATFORMS:
            return "the platform is not one this service places sandboxes on"
        if body.get("agent"):
            return "no agent profile is supported here"
        rules = 0
        for i, inline in enumerate(body.get("networkPolicies") or []):
            for field in ("allowNetworks", "denyNetworks"):
                for network in inline.get(field) or []:
                    rules += 1
                    if _destination(network) is None:
                        return (f"networkPolicies[{i}].{field}: {network[:60]!r} is not an "
                                "exact network name, IP or CIDR")
        # Each rule is up to two nodes of the exact view, which holds at most 256.
        if 2 * rules + 4 > EXACT_NODES:
            return "networkPolicies: more rules than this service materializes"
        timeouts = (body.get("features") or {}).get("timeouts")
        if timeouts is not None:
            if timeouts.get("onTimeout") not in (None, "delete"):
                return "this service applies only the delete action at a timeout"
            if timeouts.get("timeout") and _seconds(timeouts["timeout"]) <= 0:
                return "the timeout must be positive"
        return None

    def _effective_policy(self, body: dict) -> Policy:
        """The policy a new sandbox gets: deny-all, the fail-closed default
        (no governance layer here adds a rule), plus the create's inline
        policies, bound as the attached layer; the policy knobs stand for an
        organization's governance layer."""
        policy = Policy("allowAll" if self.faults.take("policy_allow_all") is not None
                        else "denyAll")
        if knob := self.faults.take("policy_extra_rule"):
            policy.allow.append((knob["network"], "org", "org-rule"))
        for i, inline in enumerate(body.get("networkPolicies") or []):
            source = f"inline-{i}"
            policy.allow += [(n, "attached", source) for n in inline.get("allowNetworks") or []]
            policy.deny += [(n, "attached", source) for n in inline.get("denyNetworks") or []]
        return policy

    def _create(self, ex: Exchange) -> None:
        raw = ex.read_body()
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            return self._error(ex, 400, "invalidArgument", "the body is not JSON")
        # Unknown fields are refused before the replay lookup.
        found = self._check("request POST /v1/sandboxes", shapes.CREATE_REQUEST, body)
        if found:
            return self._error(ex, 400, "invalidArgument", "; ".join(found)[:500])
        key = ex.header("Idempotency-Key")
        if key:
            with self._lock:
                seen = self.idempotency.get(key)
            if seen and seen[0] != raw.decode():
                return self._error(ex, 409, "failedPrecondition",
                                   "The Idempotency-Key was already used with a different payload.")
            if seen:
                # The first result, as it was (even if the sandbox changed
                # or is gone since).
                _, status, answer, etag = seen
                schema = shapes.CREATE_ACCEPTED if status == 202 else shapes.CREATE_DONE
                return self._answer(ex, status, schema, answer, {"ETag": etag})
        if why := self._refusal(body):
            return self._error(ex, 400, "invalidArgument", why)
        if knob := self.faults.take("create_429"):
            return self._error(ex, 429, "resourceExhausted",
                               "Maximum running sandboxes quota reached (10)",
                               {"Retry-After": str(knob["retry_after"])})
        uid = secrets.token_hex(10)
        signs = self.faults.take("container_signs") is not None
        policy = self._effective_policy(body)
        # The container's network follows the effective policy; only the
        # egress_open knob (a service whose enforcement is broken) opens a
        # sandbox whose policy says deny-all.
        lie = self.faults.take("egress_open") is not None
        network = "bridge" if policy.open or lie else "none"
        # The start argv replaces the launch argv; without one the image's
        # own command runs (the fake's image has none: such a sandbox fails).
        start = ((body.get("startupExecution") or {}).get("rawImage") or {}).get("start")
        main = list(start["argv"]) if start else []
        try:
            container, failed = self.docker.create(self.image, uid, network=network, env={},
                                                   container_signs=signs, main=main), None
        except ContainerError as e:
            container, failed = "", e.message
        s = Sandbox(uid, body, container, f"{self.endpoint_origin}/endpoints/{uid}")
        s.policy = policy
        for knob, flag in [("wrong_display_name", "wrong_name"), ("bigger_size", "bigger"),
                           ("endpoint_no_exec", "no_exec")]:
            if self.faults.take(knob) is not None:
                s.flags.add(flag)
        status = 201
        if failed is not None:
            s.fail("aborted", f"the sandbox's main process did not start: {failed[:200]}")
        elif self.faults.take("create_failed") is not None:
            s.fail("internal", "the VM did not boot")
        elif knob := self.faults.take("create_202"):
            s.status, s.pending_reads, status = "creating", knob["polls"], 202
        else:
            s.arm()
        answer = self._sandbox_json(s)
        with self._lock:
            self.sandboxes[uid] = s
            self.counts["created"] += 1
            res = body.get("resources") or {}
            self.asked.append((body.get("imageRef"), res.get("cpus"), res.get("memoryMib")))
            if key:
                self.idempotency[key] = (raw.decode(), status, answer, s.etag)
        if container:
            threading.Thread(target=self._watch, args=(s,), daemon=True,
                             name="fake-dockercloud-main").start()
        self._answer(ex, status,
                     shapes.CREATE_ACCEPTED if status == 202 else shapes.CREATE_DONE,
                     answer, {"ETag": s.etag})

    def _get(self, ex: Exchange, s: "Sandbox | None") -> None:
        if s is None:
            return self._error(ex, 404, "notFound", "sandbox not found")
        with self._lock:
            if s.status == "creating":
                s.pending_reads -= 1
                if s.pending_reads <= 0:
                    s.status, s.revision = "running", s.revision + 1
                    s.arm()
        self._answer(ex, 200, shapes.SANDBOX, self._sandbox_json(s), {"ETag": s.etag})

    def _list(self, ex: Exchange) -> None:
        query = parse_qs(ex.raw_query, keep_blank_values=True)
        size_text = (query.get("pageSize") or ["0"])[0]
        if not re.fullmatch(r"-?\d+", size_text) or int(size_text) < 0:
            return self._error(ex, 400, "invalidArgument", "pageSize is not a size")
        # Zero is the default; a larger size than the most is cut to it.
        size = min(int(size_text) or LIST_PAGE, LIST_PAGE)
        token = (query.get("pageToken") or [""])[0]
        with self._lock:
            issued = token in self.page_tokens
        if token and not issued:
            return self._error(ex, 400, "invalidArgument", "pageToken was not issued here")
        after = int(base64.urlsafe_b64decode(token + "==").decode()[len("after-"):]) if token else 0
        wanted = {}
        for term in filter(None, ",".join(query.get("filter") or []).split(",")):
            field, eq, value = term.partition("=")
            if not eq or field.strip() not in LIST_FIELDS:
                return self._error(ex, 400, "invalidArgument",
                                   f"filter: {term[:60]!r} is not field=value on a portable field")
            wanted[field.strip()] = value.strip()
        with self._lock:
            found = sorted((s for s in self.sandboxes.values() if s.seq > after
                            and all({"name": f"sandboxes/{s.uid}", "display_name": s.display_name,
                                     "uid": s.uid, "status": s.status,
                                     "agent": s.request.get("agent", "")}[k] == v
                                    for k, v in wanted.items())),
                           key=lambda s: s.seq)
            page = found[:size]
            following = ""
            if len(found) > size:
                # Opaque, and bound to a place in creation order: a sandbox
                # deleted between pages does not shift the next one.
                following = _b64url(f"after-{page[-1].seq}".encode())
                self.page_tokens.add(following)
            listed = [self._sandbox_json(s) for s in page]
        self._answer(ex, 200, shapes.LIST_ANSWER,
                     {"sandboxes": listed, "nextPageToken": following})

    def _delete(self, ex: Exchange, s: "Sandbox | None", query: dict) -> None:
        match = ex.header("If-Match")
        if not match:
            return self._error(ex, 428, "failedPrecondition", "etag_required: send If-Match")
        force = (query.get("force") or ["false"])[-1]
        if force not in ("true", "false"):
            return self._error(ex, 400, "invalidArgument", "force is true or false")
        if s is None:
            return ex.reply(204)
        if match == "*" or match != s.etag or self.faults.take("delete_stale") is not None:
            s.revision += 1
            body = {"code": "failedPrecondition", "message": "etag_mismatch: the sandbox changed",
                    "details": [{"@type": "type.googleapis.com/docker.sandboxes.v1.EtagMismatch",
                                 "currentEtag": s.etag}]}
            return self._answer(ex, 412, shapes.ERROR, body)
        # The state the fake refuses to delete without force: one still
        # being created.
        if s.status == "creating" and force != "true":
            return self._error(ex, 409, "failedPrecondition",
                               "the sandbox is still being created; delete it with force")
        if self.faults.take("delete_204") is not None:
            self._remove(s)
            return ex.reply(204)
        with self._lock:
            start = s.status != "deleting"
            if start:
                s.status, s.revision, s.expires = "deleting", s.revision + 1, None
            answer = self._sandbox_json(s)
        if start:
            threading.Thread(target=self._finish_delete, args=(s,), daemon=True,
                             name="fake-dockercloud-delete").start()
        self._answer(ex, 202, shapes.DELETE_ACCEPTED, answer, {"ETag": s.etag})

    def _policies(self, ex: Exchange, s: Sandbox) -> None:
        with self._lock:
            self.counts["policy_reads"] += 1
        self._answer(ex, 200, shapes.POLICIES_ANSWER, s.policy.answer(s.revision))

    def _mint(self, ex: Exchange, s: Sandbox) -> None:
        body = self._request_json(ex, shapes.CREDENTIAL_REQUEST)
        if body is None:
            return
        if knob := self.faults.take("mint_429"):
            return self._error(ex, 429, "resourceExhausted", "slow down",
                               {"Retry-After": str(knob["retry_after"])})
        ttl = min(300.0, max(1.0, float((body.get("ttl") or "300s")[:-1])))
        token = "sbx_" + secrets.token_urlsafe(24)
        s.credentials[token] = (time.time() + ttl, frozenset(body["permissions"]))
        with self._lock:
            self.counts["mints"] += 1
        expires = _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=ttl)
        answer = {"token": token, "expireTime": expires.isoformat().replace("+00:00", "Z"),
                  "permissions": body["permissions"], "sandbox": f"sandboxes/{s.uid}",
                  "audience": "sandbox-endpoint"}
        self._answer(ex, 200, shapes.CREDENTIAL_ANSWER, answer, {"Cache-Control": "no-store"})

    # ---- the sandbox endpoint ------------------------------------------------------------

    def _endpoint(self, ex: Exchange, uid: str, path: str) -> None:
        with self._lock:
            s = self.sandboxes.get(uid)
        token = self._bearer(ex) or ""
        with self._lock:
            if token in self.tokens:
                self.counts["management_token_on_endpoint"] += 1
        if s is None:
            return self._error(ex, 404, "notFound", "sandbox not found")
        expiry, granted = s.credentials.get(token, (0.0, frozenset()))
        if time.time() >= expiry:
            return self._error(ex, 401, "unauthenticated", "invalid endpoint credential",
                               reason="ENDPOINT_CREDENTIAL_INVALID")
        operation = {("POST", "/v1/processes/exec"): "exec",
                     ("POST", "/v1/files/upload"): "upload",
                     ("GET", "/v1/files/download"): "download"}.get((ex.method, path))
        if operation is None:
            return ex.reply(404, b"404 page not found", "text/plain")
        if NEEDS[operation] not in granted:
            return self._error(ex, 403, "permissionDenied",
                               f"the credential does not grant {NEEDS[operation]}")
        if s.status != "running":
            return self._error(ex, 409, "failedPrecondition",
                               f"the sandbox is {s.status}, not running")
        return {"exec": self._exec, "upload": self._upload,
                "download": self._download}[operation](ex, s)

    def _exec(self, ex: Exchange, s: Sandbox) -> None:
        body = self._request_json(ex, shapes.EXEC_REQUEST)
        if body is None:
            return
        with self._lock:
            self.counts["execs"] += 1
        cwd = body.get("workingDir")
        if cwd and self.faults.take("exec_ignores_workdir") is not None:
            cwd = "/"
        argv = self.docker.exec_argv(s.container, body["cmd"], user=body.get("user", "root"),
                                     cwd=cwd, env=body.get("env"))
        try:
            done = subprocess.run(argv, capture_output=True, timeout=600, check=False)
        except subprocess.TimeoutExpired:
            return self._error(ex, 504, "deadlineExceeded", "the exec did not finish")
        out, err = done.stdout, done.stderr
        answer: dict = {}
        if (len(out) + len(err) > EXEC_CAPTURE
                or self.faults.take("exec_incomplete") is not None):
            answer["incomplete"] = True
            out, err = out[:EXEC_CAPTURE // 2], err[:EXEC_CAPTURE // 2]
        if done.returncode:
            answer["exitCode"] = done.returncode  # zero values are left out
        if out:
            answer["stdout"] = base64.b64encode(out).decode()
        if err:
            answer["stderr"] = base64.b64encode(err).decode()
        self._answer(ex, 200, shapes.EXEC_ANSWER, answer)

    def _upload(self, ex: Exchange, s: Sandbox) -> None:
        content_type = ex.header("Content-Type") or ""
        if not content_type.startswith("multipart/form-data"):
            return self._error(ex, 400, "invalidArgument", "the upload is multipart/form-data")
        message = BytesParser(policy=HTTP).parsebytes(
            b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + ex.read_body())
        if any(type(d).__name__ == "CloseBoundaryNotFoundDefect" for d in message.defects):
            return self._error(ex, 400, "invalidArgument",
                               "the upload has no closing delimiter: nothing was written")
        parts = list(message.iter_parts())
        files = []
        for i in range(0, len(parts), 2):
            meta, content = parts[i], parts[i + 1] if i + 1 < len(parts) else None
            if (meta.get_param("name", header="content-disposition") != "metadata" or content is None
                    or content.get_param("name", header="content-disposition") != "content"):
                return self._error(ex, 400, "invalidArgument",
                                   f"occurrence {i // 2}: parts go metadata, then content")
            if meta["Content-Transfer-Encoding"] or content["Content-Transfer-Encoding"]:
                return self._error(ex, 400, "invalidArgument",
                                   f"occurrence {i // 2}: Content-Transfer-Encoding is refused")
            try:
                header = json.loads(meta.get_payload(decode=True))
            except ValueError:
                return self._error(ex, 400, "invalidArgument", f"occurrence {i // 2}: metadata is not JSON")
            if self._check("request upload metadata", shapes.FILE_HEADER, header):
                return self._error(ex, 400, "invalidArgument", f"occurrence {i // 2}: bad metadata")
            # mode & 0777, or 0644 when that is zero; no umask.
            mode = (header.get("mode") or 0) & 0o777 or 0o644
            files.append((header["path"], content.get_payload(decode=True) or b"", mode))
        if self.faults.take("upload_short") is not None and files:
            files = files[:-1]
        for i, (path, data, mode) in enumerate(files):
            code, err = self._write(s.container, path, data, mode)
            if code == _NOT_REGULAR:
                return self._error(ex, 409, "failedPrecondition",
                                   f"path_authority_nonregular_object: occurrence {i}: "
                                   "the path names an existing non-regular object")
            if code == _NO_PARENT:
                return self._error(ex, 404, "notFound",
                                   f"occurrence {i}: the file's directory does not exist")
            if code:
                return self._error(ex, 500, "internal", f"occurrence {i}: the write failed: "
                                   + err.decode(errors="replace")[:200])
        self._answer(ex, 200, shapes.UPLOAD_ANSWER, {"filesWritten": len(files)})

    def _in_container(self, container: str, script: str, *args: str,
                      data: "bytes | None" = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.docker.docker, "exec"] + (["-i"] if data is not None else [])
            + ["-u", "root", container, "/bin/sh", "-c", script, "fake-dockercloud", *args],
            input=data, capture_output=True, timeout=120, check=False)

    def _write(self, container: str, path: str, data: bytes, mode: int) -> "tuple[int, bytes]":
        """Writes one uploaded file with exactly `mode`; its directory must
        exist (nothing says an upload makes one). (exit status, stderr)"""
        done = self._in_container(
            container,
            f'if [ -e "$1" ] && [ ! -f "$1" ]; then exit {_NOT_REGULAR}; fi; '
            f'[ -d "$(dirname -- "$1")" ] || exit {_NO_PARENT}; '
            'cat > "$1" && chmod "$2" -- "$1"', path, f"{mode:o}", data=data)
        return done.returncode, done.stderr

    def _read(self, container: str, path: str) -> "tuple[int, int, bytes]":
        """(exit status, stored permission bits, content) of a regular file."""
        done = self._in_container(
            container,
            f'[ -e "$1" ] || exit {_ABSENT}; [ -f "$1" ] || exit {_NOT_REGULAR}; '
            'stat -L -c %a -- "$1" && exec cat -- "$1"', path)
        if done.returncode:
            return done.returncode, 0, b""
        bits, _, content = done.stdout.partition(b"\n")
        return 0, int(bits, 8) & 0o777, content

    def _download(self, ex: Exchange, s: Sandbox) -> None:
        paths = parse_qs(ex.raw_query).get("paths") or []
        if not paths:
            return self._error(ex, 400, "invalidArgument", "paths is required")
        boundary = "fake-" + secrets.token_hex(8)
        chunks = []

        def part(name: str, content_type: str, data: bytes) -> None:
            chunks.append(f"--{boundary}\r\nContent-Disposition: attachment; name={name}\r\n"
                          f"Content-Type: {content_type}\r\n\r\n".encode() + data + b"\r\n")

        for path in paths:
            if _canonical(path):
                code, mode, data = self._read(s.container, path)
            else:
                code, mode, data = _NOT_CANONICAL, 0, b""
            if code:
                why, message = _FILE_FAILURES.get(code, ("internal", "the file could not be read"))
                failure = {"path": path, "failure": {"code": why, "message": message}}
                self._check("answer download error part", shapes.FILE_ERROR, failure)
                part("error", "application/json", json.dumps(failure).encode())
                continue
            header = {"path": path, "mode": mode}
            self._check("answer download metadata part", shapes.FILE_HEADER, header)
            part("metadata", "application/json", json.dumps(header).encode())
            part("content", "application/octet-stream", data)
        if self.faults.take("download_stream_error") is not None:
            part("stream-error", "application/json",
                 json.dumps({"code": "internal", "message": "the stream failed"}).encode())
        cut = self.faults.take("download_cut") is not None
        body = b"".join(chunks) + (b"" if cut else f"--{boundary}--\r\n".encode())
        ex.reply(200, body, f"multipart/mixed; boundary={boundary}")
