"""E2B's API (spec/openapi.yml): sandboxes created, listed, described,
timed and killed; every request needs the team's `X-API-Key`.

Listing also comes in two versions. `GET /v2/sandboxes` is the current one:
running and paused sandboxes, filtered, newest first, in pages of at most
100 chained by the `X-Next-Token` header. `GET /sandboxes` is deprecated
("Use GET /v2/sandboxes instead."): running sandboxes only, one answer. The
fake counts the calls to each, so a test can show a client stays off the
deprecated one.

A running sandbox's egress rules can be replaced (`PUT
/sandboxes/{id}/network`) for the sandboxes whose network the fake can
change: those with none and those in a jail (egress.py, jail.py).

Create comes in two versions. `POST /sandboxes` takes the published spec's
`NewSandbox`; `POST /v2/sandboxes` takes `NewSandboxV2`, which the official
SDK (2.63.0) sends: the same fields less `secure`, plus lifecycle, IAM and
volume options, and envd access is always secured. Bodies are validated
strictly: a field neither version defines is refused with 400.
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import json
import re
import secrets
import threading
import time
from urllib.parse import unquote_plus

import egress
from container import ContainerError
from httpio import BadRequest, Exchange
from sandboxes import Registry, Sandbox

# ---- request bodies: a small JSON-schema subset -------------------------------------

INT32_MAX = 2**31 - 1
STR = {"type": "string"}
BOOL = {"type": "boolean"}
STR_LIST = {"type": "array", "items": STR}
STR_MAP = {"type": "object", "values": STR}  # additionalProperties: string
ANY_OBJECT = {"type": "object", "values": None}  # any properties
TIMEOUT = {"type": "integer", "min": 0, "max": INT32_MAX}

NETWORK_V1 = {"type": "object", "properties": {
    "allowPublicTraffic": BOOL, "allowOut": STR_LIST, "denyOut": STR_LIST,
    "maskRequestHost": STR}}
NETWORK_V2 = {"type": "object", "properties": {
    **NETWORK_V1["properties"],
    "allowPublicTraffic": {**BOOL, "nullable": True},
    "dnsServers": STR_LIST, "egressProxy": {**ANY_OBJECT, "nullable": True},
    "httpsPorts": {"type": "array", "items": {"type": "integer", "min": 1, "max": 65535}},
    "rules": ANY_OBJECT}}
MCP = {**ANY_OBJECT, "nullable": True}

NEW_SANDBOX = {"type": "object", "required": ["templateID"], "properties": {
    "templateID": STR, "timeout": TIMEOUT, "autoPause": BOOL, "secure": BOOL,
    "allow_internet_access": BOOL, "network": NETWORK_V1, "metadata": STR_MAP,
    "envVars": STR_MAP, "mcp": MCP}}
NEW_SANDBOX_V2 = {"type": "object", "required": ["templateID"], "properties": {
    "templateID": STR, "timeout": TIMEOUT, "autoPause": BOOL, "autoPauseMemory": BOOL,
    "autoResume": {"type": "object", "required": ["enabled"], "properties": {"enabled": BOOL}},
    "allow_internet_access": BOOL, "network": NETWORK_V2, "metadata": STR_MAP,
    "envVars": STR_MAP, "mcp": MCP, "iam": ANY_OBJECT,
    "volumeMounts": {"type": "array", "items": {"type": "object", "required": ["name", "path"],
                                                "properties": {"name": STR, "path": STR}}}}}
TIMEOUT_BODY = {"type": "object", "required": ["timeout"], "properties": {"timeout": TIMEOUT}}
REFRESH_BODY = {"type": "object", "properties": {
    "duration": {"type": "integer", "min": 0, "max": 3600}}}
CONNECT_BODY = TIMEOUT_BODY
# SandboxNetworkUpdateConfig, the body of PUT /sandboxes/{id}/network, as
# the published spec has it (E2B's SDK 2.63.0 also knows `dnsServers`; the
# spec does not, so the fake refuses it as an unknown field).
NETWORK_UPDATE = {"type": "object", "properties": {
    "allowOut": STR_LIST, "denyOut": STR_LIST, "egressProxy": {**ANY_OBJECT, "nullable": True},
    "rules": ANY_OBJECT, "allow_internet_access": BOOL}}
CONNECT_V2_BODY = {"type": "object", "properties": {"timeout": TIMEOUT, "memory": BOOL}}


class Invalid(Exception):
    pass


def validate(schema: dict, value, where: str = "body") -> None:
    if value is None:
        if schema.get("nullable"):
            return
        raise Invalid(f"{where}: must not be null")
    kind = schema["type"]
    if kind == "string" and not isinstance(value, str):
        raise Invalid(f"{where}: expected a string")
    if kind == "boolean" and not isinstance(value, bool):
        raise Invalid(f"{where}: expected a boolean")
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(f"{where}: expected an integer")
        if not schema.get("min", -INT32_MAX - 1) <= value <= schema.get("max", INT32_MAX):
            raise Invalid(f"{where}: {value} is out of range")
    if kind == "array":
        if not isinstance(value, list):
            raise Invalid(f"{where}: expected an array")
        for i, item in enumerate(value):
            validate(schema["items"], item, f"{where}[{i}]")
    if kind == "object":
        if not isinstance(value, dict):
            raise Invalid(f"{where}: expected an object")
        for name in schema.get("required", []):
            if name not in value:
                raise Invalid(f"{where}: {name} is required")
        properties = schema.get("properties")
        for name, item in value.items():
            if properties is not None:
                if name not in properties:
                    raise Invalid(f"{where}: unknown field {name!r}")
                validate(properties[name], item, f"{where}.{name}")
            elif schema.get("values") is not None:
                validate(schema["values"], item, f"{where}.{name}")


# ---- the API ---------------------------------------------------------------------------

def _error(ex: Exchange, status: int, message: str, headers=None) -> None:
    ex.json(status, {"code": status, "message": message}, headers)


def _rfc3339(seconds: float) -> str:
    return _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


class ControlPlane:
    def __init__(self, registry: Registry, faults, *, api_key: str, templates: dict,
                 envd_version: str, domain: "str | None") -> None:
        self.registry, self.faults, self.api_key = registry, faults, api_key
        self.templates, self.envd_version = templates, envd_version
        self.domain = domain
        self._idempotent: "dict[str, str]" = {}  # Idempotency-Key -> sandbox ID
        self._idempotent_lock = threading.Lock()
        # Listing requests served, by version ("deprecated": GET /sandboxes).
        self.listings = {"v2": 0, "deprecated": 0}
        # Sandboxes created, by the template asked for.
        self.templates_used: "dict[str, int]" = {}
        self._listings_lock = threading.Lock()

    def serve(self, ex: Exchange) -> None:
        if ex.header("X-API-Key") != self.api_key:
            return _error(ex, 401, "Invalid API key")
        path, method = ex.path.rstrip("/") or "/", ex.method
        if path == "/health" and method == "GET":
            return ex.json(200, {"status": "ok"})
        if path in ("/sandboxes", "/v2/sandboxes"):
            if method == "POST":
                return self.create(ex, v2=path.startswith("/v2"))
            if method == "GET":
                return self.list(ex, v2=path.startswith("/v2"))
            return _error(ex, 405, f"{method} is not allowed on {path}")
        match = re.fullmatch(r"(/v2)?/sandboxes/([^/]+)(?:/([a-z]+))?", path)
        if not match:
            return _error(ex, 404, f"no route {method} {path}")
        v2, sandbox_id, action = bool(match.group(1)), match.group(2), match.group(3)
        route = (method, action, v2)
        handlers = {
            ("GET", None, False): self.get,
            ("DELETE", None, False): self.delete,
            ("POST", "timeout", False): self.set_timeout,
            ("POST", "refreshes", False): self.refresh,
            ("POST", "connect", False): self.connect,
            ("POST", "connect", True): self.connect,
            ("PUT", "network", False): self.update_network,
        }
        if route in handlers:
            return handlers[route](ex, sandbox_id)
        # In E2B's API but not in this fake (pause/resume, metrics, logs,
        # snapshots, forks): say so rather than pretend.
        return _error(ex, 501, f"{method} {path} is not implemented by fake-e2b")

    # ---- create ------------------------------------------------------------------------

    def create(self, ex: Exchange, v2: bool) -> None:
        # Rate limiting and overload come first, as from a gateway in front.
        for name, status in (("create_429", 429), ("create_503", 503)):
            fault = self.faults.take(name)
            if fault is not None:
                text = "rate limit exceeded" if status == 429 else "service unavailable"
                return _error(ex, status, text, {"Retry-After": str(fault["retry_after"])})
        try:
            body = ex.read_json()
            validate(NEW_SANDBOX_V2 if v2 else NEW_SANDBOX, body)
            spec = self._spec(body, v2)
        except (Invalid, BadRequest) as e:
            return _error(ex, 400, str(e))
        template = body["templateID"]
        if template not in self.templates:
            return _error(ex, 404, f"template '{template}' not found")
        # Faults that break what a sandbox is, not what the API says.
        if self.faults.take("create_network_ignored") is not None:
            # The lock asked for is not applied (and reads back as asked).
            spec["egress"], spec["domains"] = "open", []
        if self.faults.take("create_container_signs") is not None:
            spec["container_signs"] = True  # the sandbox shows it is a container
        delay = self.faults.take("create_delay")
        if delay is not None:
            time.sleep(float(delay["seconds"]))
        key = ex.header("Idempotency-Key")
        with self._idempotent_lock:  # a retried create answers with the same sandbox
            replay = self.registry.get(self._idempotent.get(key, "")) if key else None
        with self._listings_lock:
            self.templates_used[template] = self.templates_used.get(template, 0) + 1
        try:
            sandbox = replay or self.registry.create(self.templates[template], spec)
        except (ContainerError, RuntimeError) as e:
            return _error(ex, 500, f"cannot create the sandbox: {e}")
        if key:
            with self._idempotent_lock:
                self._idempotent[key] = sandbox.id
        answer = self._created(sandbox)
        if self.faults.take("create_no_sandbox_id") is not None:
            answer.pop("sandboxID")
        if self.faults.take("create_no_access_token") is not None:
            answer.pop("envdAccessToken", None)
        old = self.faults.take("create_old_envd")
        if old is not None:
            answer["envdVersion"] = old["version"]
        ex.json(201, answer)

    def _spec(self, body: dict, v2: bool) -> dict:
        """What the sandbox will be, from a valid body; Invalid for what the
        fake cannot honour (it refuses rather than pretends)."""
        network = body.get("network") or {}
        try:
            # Domains in allowOut on either version: both creates take the
            # spec's SandboxNetworkConfig, whose allowOut "can be a CIDR
            # block ..., a bare IP address ..., or a domain name".
            egress.check_entries(network, "body.network")
            kind, domains = egress.decide(body.get("allow_internet_access"), network)
        except egress.Refused as e:
            raise Invalid(str(e)) from None
        if body.get("autoPause"):
            raise Invalid("autoPause: pausing is not implemented by fake-e2b")
        for name in ("mcp", "iam", "volumeMounts"):
            if body.get(name):
                raise Invalid(f"{name}: not implemented by fake-e2b")
        if network.get("httpsPorts"):
            raise Invalid("network.httpsPorts: not implemented by fake-e2b")
        secure = True if v2 else bool(body.get("secure"))
        return {
            "template_id": body["templateID"],
            "timeout": body.get("timeout", 300 if v2 else 15),
            "metadata": body.get("metadata") or {},
            "env_vars": body.get("envVars") or {},
            # What the create said (None: nothing), as GET reads it back,
            # and which network the sandbox gets (egress.py).
            "allow_internet_access": body.get("allow_internet_access"),
            "egress": kind, "domains": domains,
            "network": network or None,
            "access_token": secrets.token_hex(16) if secure else None,
            "traffic_token": (secrets.token_hex(16)
                              if network.get("allowPublicTraffic") is False else None),
            "envd_version": self.envd_version,
        }

    def _created(self, sandbox: Sandbox) -> dict:
        answer = {"templateID": sandbox.template_id, "sandboxID": sandbox.id,
                  "alias": sandbox.template_id, "clientID": "fake-e2b",
                  "envdVersion": sandbox.envd_version, "trafficAccessToken":
                  sandbox.traffic_token, "domain": self.domain}
        if sandbox.access_token is not None:
            answer["envdAccessToken"] = sandbox.access_token
        return answer

    # ---- read ---------------------------------------------------------------------------

    def _listed(self, sandbox: Sandbox) -> dict:
        return {"templateID": sandbox.template_id, "alias": sandbox.template_id,
                "sandboxID": sandbox.id, "clientID": "fake-e2b",
                "startedAt": _rfc3339(sandbox.started_at), "endAt": _rfc3339(sandbox.end_at),
                "cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024, "metadata": sandbox.metadata,
                "state": sandbox.state, "envdVersion": sandbox.envd_version}

    def list(self, ex: Exchange, v2: bool) -> None:
        with self._listings_lock:
            self.listings["v2" if v2 else "deprecated"] += 1
        try:
            wanted = _metadata_filter(ex.arg("metadata"))
            query = _v2_query(ex) if v2 else None
        except Invalid as e:
            return _error(ex, 400, str(e))
        sandboxes = [s for s in self.registry.all()
                     if all(s.metadata.get(k) == v for k, v in wanted.items())]
        if query is None:  # the deprecated listing: "List all running sandboxes."
            running = [s for s in sandboxes if s.state == "running"]
            return ex.json(200, [self._listed(s) for s in running])
        sandboxes = [s for s in sandboxes
                     if (query["template"] is None or query["template"] == s.template_id)
                     and (query["started_after"] is None
                          or s.started_at >= query["started_after"])]
        headers = {}
        if "running" in query["states"]:  # counted before the state filter's other half
            headers["X-Total-Running"] = str(sum(s.state == "running" for s in sandboxes))
        sandboxes = [s for s in sandboxes if s.state in query["states"]]
        # By start time, newest first unless asked otherwise; ties by ID.
        desc = query["order"] == "desc"
        sandboxes.sort(key=lambda s: (-s.started_at if desc else s.started_at, s.id))
        if query["after"] is not None:
            started, sandbox_id = query["after"]
            cursor = (-started if desc else started, sandbox_id)
            sandboxes = [s for s in sandboxes
                         if (-s.started_at if desc else s.started_at, s.id) > cursor]
        # The page-size knob: pages smaller than asked for (the API may
        # answer fewer than `limit`; a client follows X-Next-Token anyway).
        fault = self.faults.take("list_page_size")
        limit = min(query["limit"], fault["size"]) if fault else query["limit"]
        page = sandboxes[:limit]
        if len(sandboxes) > limit:
            headers["X-Next-Token"] = _cursor(page[-1].started_at, page[-1].id)
        if self.faults.take("list_endless") is not None:
            # A cursor that never runs out: far in the future, so a page
            # after it starts again from the newest (or, ascending, is empty).
            headers["X-Next-Token"] = _cursor(time.time() + 10**9, secrets.token_hex(8))
        ex.json(200, [self._listed(s) for s in page], headers)

    def get(self, ex: Exchange, sandbox_id: str) -> None:
        sandbox = self.registry.get(sandbox_id)
        if sandbox is None:
            return _error(ex, 404, f"sandbox \"{sandbox_id}\" doesn't exist or you don't "
                                   "have access to it")
        detail = {**self._listed(sandbox), "domain": self.domain,
                  "allowInternetAccess": sandbox.allow_internet_access,
                  "lifecycle": {"autoResume": False, "onTimeout": "kill"}}
        if sandbox.access_token is not None:
            detail["envdAccessToken"] = sandbox.access_token
        if sandbox.network:
            detail["network"] = sandbox.network
        ex.json(200, detail)

    # ---- change --------------------------------------------------------------------------

    def delete(self, ex: Exchange, sandbox_id: str) -> None:
        fault = self.faults.take("delete_404")
        if fault is not None:
            if fault.get("remove", True):
                self.registry.remove(sandbox_id)  # as if its timeout won the race
            return _error(ex, 404, f"sandbox \"{sandbox_id}\" not found")
        if not self.registry.remove(sandbox_id):
            return _error(ex, 404, f"sandbox \"{sandbox_id}\" not found")
        ex.reply(204)

    def _timed(self, ex: Exchange, sandbox_id: str, schema: dict) -> "tuple[Sandbox, dict] | None":
        try:
            body = ex.read_json() or {}
            validate(schema, body)
        except (Invalid, BadRequest) as e:
            _error(ex, 400, str(e))
            return None
        sandbox = self.registry.get(sandbox_id)
        if sandbox is None:
            _error(ex, 404, f"sandbox \"{sandbox_id}\" not found")
            return None
        return sandbox, body

    def set_timeout(self, ex: Exchange, sandbox_id: str) -> None:
        found = self._timed(ex, sandbox_id, TIMEOUT_BODY)
        if found:  # overwrites the end time, counted from now
            found[0].end_at = time.time() + found[1]["timeout"]
            ex.reply(204)

    def refresh(self, ex: Exchange, sandbox_id: str) -> None:
        found = self._timed(ex, sandbox_id, REFRESH_BODY)
        if found:
            found[0].end_at = max(found[0].end_at, time.time() + found[1].get("duration", 0))
            ex.reply(204)

    def connect(self, ex: Exchange, sandbox_id: str) -> None:
        v2 = ex.path.startswith("/v2/")
        found = self._timed(ex, sandbox_id, CONNECT_V2_BODY if v2 else CONNECT_BODY)
        if found:  # the end time is only ever extended; a paused sandbox resumes
            sandbox, body = found
            sandbox.state = "running"
            sandbox.end_at = max(sandbox.end_at, time.time() + body.get("timeout", 300))
            ex.json(200, self._created(sandbox))

    def update_network(self, ex: Exchange, sandbox_id: str) -> None:
        """`PUT /sandboxes/{id}/network`: "Replaces the current egress rules
        with the provided configuration. Omitting field clears it." 204;
        the body is checked first (400), then the sandbox (404, or 409 when
        it is not running), as E2B's handler does. The fake changes a
        sandbox with no network or in a jail into either; a sandbox on the
        bridge network, or an update that would give the whole way out, is
        refused with 400 as not implemented (README.md, "Egress")."""
        try:
            body = ex.read_json()
            validate(NETWORK_UPDATE, body)
            egress.check_entries(body, "body")
            kind, domains = egress.decide(body.get("allow_internet_access"), body)
        except (Invalid, BadRequest, egress.Refused) as e:
            return _error(ex, 400, str(e))
        sandbox = self.registry.get(sandbox_id)
        if sandbox is None:
            return _error(ex, 404, f"sandbox \"{sandbox_id}\" not found")
        if sandbox.state != "running":
            return _error(ex, 409, f"sandbox \"{sandbox_id}\" is not running")
        if kind == "open" or sandbox.egress == "open":
            if kind == sandbox.egress:
                return ex.reply(204)  # the whole way out stays the whole way out
            return _error(ex, 400, "network: opening a sandbox's way out, or narrowing a sandbox "
                                   "that has it, on a running sandbox is not implemented by "
                                   "fake-e2b (only a sandbox with no network or a jail changes)")
        try:
            if not self.registry.set_egress(sandbox, kind, domains):
                return _error(ex, 409, f"sandbox \"{sandbox_id}\" is not running")
        except (ContainerError, RuntimeError) as e:
            return _error(ex, 500, f"cannot update the sandbox's network: {e}")
        sandbox.network = egress.after_update(sandbox.network, body)
        sandbox.allow_internet_access = body.get("allow_internet_access")
        ex.reply(204)


# ---- listing's query ------------------------------------------------------------------

STATES = ("running", "paused")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _unescape(text: str, what: str) -> str:
    """One query-unescaping ('+' is a space); a malformed escape is refused."""
    if _BAD_ESCAPE.search(text):
        raise Invalid(f"metadata: invalid URL escape in the {what}")
    try:
        return unquote_plus(text, errors="strict")
    except UnicodeDecodeError:
        raise Invalid(f"metadata: the {what} is not UTF-8 once unescaped") from None


def _metadata_filter(raw: "str | None") -> "dict[str, str]":
    """The `metadata` parameter (already decoded once, as every query value
    is): `k=v&k2=v2`, each key and value URL-encoded. E2B's SDKs
    percent-encode each key and value and then encode the pairs again as a
    query string, and E2B's API undoes exactly that: the whole is unescaped,
    split into `k=v` pairs (anything else is refused), and each key and value
    unescaped. Keys and values of unreserved characters read the same either
    way, so a client that encodes them once, as the spec's sentence reads,
    gets the same answer for those."""
    if raw is None:
        return {}
    wanted = {}
    for pair in _unescape(raw, "query").split("&"):
        parts = pair.split("=")
        if len(parts) != 2:
            raise Invalid(f"metadata: {pair!r} is not one key=value pair")
        wanted[_unescape(parts[0], "key")] = _unescape(parts[1], "value")
    return wanted


def _cursor(started_at: float, sandbox_id: str) -> str:
    """An opaque page cursor: the last listed sandbox's start time and ID."""
    raw = json.dumps([started_at, sandbox_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _uncursor(token: str) -> "tuple[float, str]":
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        started, sandbox_id = json.loads(raw)
        if isinstance(started, (int, float)) and not isinstance(started, bool) \
                and isinstance(sandbox_id, str):
            return float(started), sandbox_id
    except (binascii.Error, ValueError, TypeError):
        pass
    raise Invalid("nextToken: not a cursor this API issued")


def _v2_query(ex: Exchange) -> dict:
    """`GET /v2/sandboxes`'s parameters other than metadata, checked against
    the spec; anything outside it is refused with 400."""
    state = ex.arg("state")
    # `state` is a form-style, unexploded array: `running,paused`. Omitted,
    # both states (the spec names no default; the SDK documents both).
    states = STATES if state is None else tuple(state.split(","))
    if not states or any(s not in STATES for s in states):
        raise Invalid(f"state: {state!r} is not a list of running, paused")
    order = ex.arg("order") or "desc"  # "Defaults to desc (newest first)."
    if order not in ("asc", "desc"):
        raise Invalid(f"order: {order!r} is not asc or desc")
    limit_arg = ex.arg("limit")
    try:
        limit = 100 if limit_arg is None else int(limit_arg)
    except ValueError:
        raise Invalid("limit: not an integer") from None
    if not 1 <= limit <= 100:  # minimum 1, maximum 100, default 100
        raise Invalid(f"limit: {limit} is outside 1..100")
    token = ex.arg("nextToken")
    started_after = ex.arg("startedAfter")
    if started_after is not None:
        try:
            moment = _dt.datetime.fromisoformat(started_after)
        except ValueError:
            raise Invalid("startedAfter: not an RFC 3339 date-time") from None
        if moment.tzinfo is None:
            raise Invalid("startedAfter: an RFC 3339 date-time needs its offset")
        started_after = moment.timestamp()
    return {"states": states, "order": order, "limit": limit,
            "after": _uncursor(token) if token else None,
            "started_after": started_after, "template": ex.arg("template")}
