"""The grant client for python in a container, found through PYTHONPATH only
in runs that carry a grant. It installs `host` (or the profile's name) as a
builtin: host.get(path), host.post(path, body), ..., host.call(method, path,
body). Synchronous; JSON in and out; raises HostApiError on anything but a
2xx. In a container it speaks HTTP to the broker over the run's Unix
socket; in a hosted sandbox, HTTPS to the daemon's guard with the run's
token, trusting only the authority it was handed if any."""

import builtins
import http.client
import json
import os
import socket
import ssl
import urllib.parse


class HostApiError(Exception):
    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class _Connection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost")
        self._path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self._path)
        self.sock = s


_PREFIX = {
    "not-permitted": "not permitted by sandbox capability",
    "budget": "host call budget exhausted",
    "shed": "host api 503",
    "upstream-failed": "host api call failed",
}


class _Guard:
    """Connections to the daemon's guard: TLS to its name, verified against
    the handed authority (or the system's), the run's token on each request."""

    def __init__(self, url, token, cafile):
        parsed = urllib.parse.urlsplit(url)
        self._host, self._port = parsed.hostname, parsed.port or 443
        self._token = token
        # The handed authority, else the system's compiled-in store only:
        # never one the sandbox's environment names (SSL_CERT_FILE, which
        # OpenShell points at its own MITM CA).
        self._context = ssl.create_default_context(
            cafile=cafile or ssl.get_default_verify_paths().openssl_cafile)

    def connection(self):
        # A sandbox whose only way out is its service's egress proxy
        # (OpenShell's) names it: a CONNECT tunnel to the guard, this
        # client's own TLS inside it; the proxy never sees the token.
        proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
        if proxy:
            p = urllib.parse.urlsplit(proxy)
            conn = http.client.HTTPSConnection(p.hostname, p.port or 80, context=self._context)
            conn.set_tunnel(self._host, self._port)
            return conn
        return http.client.HTTPSConnection(self._host, self._port, context=self._context)

    def headers(self):
        return {"x-plimsoll-guard": self._token}


class _Socket:
    def __init__(self, path):
        self._path = path

    def connection(self):
        return _Connection(self._path)

    def headers(self):
        return {}


class _Host:
    def __init__(self, transport):
        self._transport = transport

    def call(self, method, path, body=None):
        conn = self._transport.connection()
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = self._transport.headers()
            if payload is not None:
                headers["content-type"] = "application/json"
            conn.request(str(method).upper(), str(path), body=payload, headers=headers)
            resp = conn.getresponse()
            text = resp.read().decode("utf-8", "replace")
        except OSError as e:
            raise HostApiError(f"host api call failed: {e}") from None
        finally:
            conn.close()
        broker = resp.getheader("plimsoll-broker")
        if broker and broker != "upstream":
            raise HostApiError(f"{_PREFIX.get(broker, 'host api refused')}: {text}", resp.status)
        if not 200 <= resp.status <= 299:
            raise HostApiError(f"host api {resp.status}: {text}", resp.status)
        if text == "":
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text

    def get(self, path):
        return self.call("GET", path)

    def delete(self, path):
        return self.call("DELETE", path)

    def put(self, path, body=None):
        return self.call("PUT", path, body)

    def post(self, path, body=None):
        return self.call("POST", path, body)

    def patch(self, path, body=None):
        return self.call("PATCH", path, body)


def _transport():
    if os.environ.get("HOST_API_SOCKET"):
        return _Socket(os.environ["HOST_API_SOCKET"])
    if os.environ.get("PLIMSOLL_GUARD_URL"):
        return _Guard(os.environ["PLIMSOLL_GUARD_URL"],
                      os.environ.get("PLIMSOLL_GUARD_TOKEN", ""),
                      os.environ.get("PLIMSOLL_GUARD_CA") or None)
    return None


_transport_now = _transport()
if _transport_now is not None:
    setattr(builtins, os.environ.get("PLIMSOLL_GRANT_GLOBAL", "host"), _Host(_transport_now))
    builtins.HostApiError = HostApiError
