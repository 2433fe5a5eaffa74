"""Fault knobs: misbehaviour the fake produces on request, for the next N
matching requests (count) or until cleared (count null).

Each knob has defaults for its parameters; setting a knob may override them.
The knobs are the failures a client of E2B has to survive; what each one
looks like on the wire is described in README.md.
"""

from __future__ import annotations

import threading

MIB = 1024 * 1024

KNOBS: "dict[str, dict]" = {
    # Control plane, on create (POST /sandboxes and POST /v2/sandboxes).
    "create_429": {"retry_after": 1},          # 429 + Retry-After, nothing created
    "create_503": {"retry_after": 1},          # 503 + Retry-After, nothing created
    "create_delay": {"seconds": 2.0},          # answer late (the sandbox is created)
    "create_no_sandbox_id": {},                # 201 without sandboxID (sandbox exists!)
    "create_no_access_token": {},              # 201 without envdAccessToken (secure)
    "create_old_envd": {"version": "0.0.1"},   # 201 naming an old envdVersion
    "create_network_ignored": {},              # the sandbox gets a network despite the lock
    "create_container_signs": {},              # the sandbox shows a container's marker
    # Control plane, on GET /v2/sandboxes.
    "list_page_size": {"size": 2},             # pages of at most `size`, whatever `limit` says
    "list_endless": {},                        # every page names a next page (a fresh cursor)
    # Control plane, on DELETE /sandboxes/{id}.
    "delete_404": {"remove": True},            # 404; remove=false keeps the sandbox
    # envd.
    "envd_not_found": {},                      # 502 "The sandbox was not found"
    "upload_dropped": {},                      # POST /files answers 200, writes nothing
    "start_cut": {},                           # Start stream closed before its EndEvent
    "stdout_flood": {"bytes": 32 * MIB + MIB, "chunk": 64 * 1024},  # Start floods stdout
}


class FaultError(ValueError):
    pass


class Faults:
    def __init__(self, knobs: "dict[str, dict] | None" = None) -> None:
        self._knobs = KNOBS if knobs is None else knobs  # another fake's table
        self._lock = threading.Lock()
        self._armed: "dict[str, dict]" = {}

    def set(self, name: str, count: "int | None" = 1, **params) -> None:
        if name not in self._knobs:
            raise FaultError(f"unknown fault {name!r}; known: {sorted(self._knobs)}")
        unknown = set(params) - set(self._knobs[name])
        if unknown:
            raise FaultError(f"fault {name!r} takes no parameter(s) {sorted(unknown)}")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool)
                                  or count < 1):
            raise FaultError("count must be a positive integer, or null for 'until cleared'")
        with self._lock:
            self._armed[name] = {"count": count, "params": {**self._knobs[name], **params}}

    def clear(self, name: "str | None" = None) -> None:
        with self._lock:
            if name is None:
                self._armed.clear()
            else:
                self._armed.pop(name, None)

    def take(self, name: str) -> "dict | None":
        """The knob's parameters if it is armed, spending one use of it."""
        with self._lock:
            armed = self._armed.get(name)
            if armed is None:
                return None
            if armed["count"] is not None:
                armed["count"] -= 1
                if armed["count"] <= 0:
                    del self._armed[name]
            return dict(armed["params"])

    def snapshot(self) -> dict:
        with self._lock:
            return {name: dict(armed) for name, armed in self._armed.items()}

    def apply_json(self, body) -> None:
        """`POST /_fake/faults`: one knob `{"name": ..., "count": ..., params...}`,
        a list of them, or `{"clear": true}` / `{"clear": "<name>"}`."""
        items = body if isinstance(body, list) else [body]
        for item in items:
            if not isinstance(item, dict):
                raise FaultError("each fault must be a JSON object")
            if "clear" in item:
                self.clear(None if item["clear"] is True else item["clear"])
                continue
            item = dict(item)
            name = item.pop("name", None)
            if not isinstance(name, str):
                raise FaultError('a fault needs "name"')
            self.set(name, item.pop("count", 1), **item)
