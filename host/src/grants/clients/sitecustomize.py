"""The grant client for python in a container, found through PYTHONPATH only
in runs that carry a grant. It installs `host` (or the profile's name) as a
builtin: host.get(path), host.post(path, body), ..., host.call(method, path,
body). Synchronous; JSON in and out; raises HostApiError on anything but a
2xx. It speaks HTTP to the broker over the run's Unix socket."""

import builtins
import http.client
import json
import os
import socket


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


class _Host:
    def __init__(self, path):
        self._path = path

    def call(self, method, path, body=None):
        conn = _Connection(self._path)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"content-type": "application/json"} if payload is not None else {}
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


_socket = os.environ.get("HOST_API_SOCKET")
if _socket:
    setattr(builtins, os.environ.get("PLIMSOLL_GRANT_GLOBAL", "host"), _Host(_socket))
    builtins.HostApiError = HostApiError
