"""The request and answer shapes of Docker's Sandboxes REST API (v1), as
JSON Schema (2020-12), for the parts plimsoll uses.

Written here from the OpenAPI document Docker publishes for the API
(docker/docs, content/reference/api/sandboxes/api.yaml, read at commit
1b8bdb16a2b2): field names, types, enums, patterns and which objects refuse
unknown keys are as published; the document itself is not copied (and this
machine's CI cannot reach it). fake-dockercloud checks every request it is
sent and every answer it gives against these, and records any mismatch;
the tests fail on one.

Where the document is looser than what the fake answers (no field of an
exec answer is required, a sandbox's endpoint URI is optional), the schema
here is as loose as the document: the fake is held to Docker's contract,
not to plimsoll's expectations.
"""

from __future__ import annotations

import jsonschema

DURATION = {"type": "string", "pattern": r"^-?\d+(\.\d{1,9})?s$"}
TIMESTAMP = {"type": "string", "format": "date-time"}
INT64 = {"type": ["integer", "string"], "pattern": r"^-?\d+$"}
ENDPOINT_PERMISSION = {"enum": ["sandboxesExec", "sandboxesFilesRead", "sandboxesFilesWrite"]}
STATUS = {"enum": ["creating", "starting", "running", "stopping", "stopped", "failed",
                   "deleting", "degraded"]}
ERROR_CODES = ["canceled", "unknown", "invalidArgument", "deadlineExceeded", "notFound",
               "alreadyExists", "permissionDenied", "resourceExhausted", "failedPrecondition",
               "aborted", "outOfRange", "unimplemented", "internal", "unavailable", "dataLoss",
               "unauthenticated"]

RESOURCES = {
    "type": "object", "additionalProperties": False,
    "properties": {"cpus": {"type": ["integer", "null"]},
                   "memoryMib": {"type": ["integer", "string", "null"]}},
}
PLATFORM = {
    "type": "object", "additionalProperties": False,
    "properties": {"os": {"type": "string"}, "architecture": {"type": "string"}},
}
# A platform a create names must name both halves (the document says so in
# words: "explicit platform requires OS and architecture").
PLATFORM_ASKED = {**PLATFORM, "required": ["os", "architecture"],
                  "properties": {"os": {"type": "string", "minLength": 1},
                                 "architecture": {"type": "string", "minLength": 1}}}

CREATE_REQUEST = {
    "type": "object",
    "properties": {
        "agent": {"type": "string"},
        "displayName": {"type": "string", "maxLength": 64, "pattern": r"^[a-zA-Z0-9_-]*$"},
        "displayNamePrefix": {"type": "string"},
        "environment": {"type": "object", "additionalProperties": {"type": "string"}},
        "resources": RESOURCES,
        "pullPolicy": {"enum": ["unspecified", "always"]},
        "networkPolicies": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["mode"],
            "properties": {"mode": {"enum": ["denyAll"]},
                           "allowNetworks": {"type": "array", "items": {"type": "string"}},
                           "denyNetworks": {"type": "array", "items": {"type": "string"}}}}},
        "policyIds": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "platform": PLATFORM_ASKED,
        "startupExecution": {
            "type": "object", "additionalProperties": False, "required": ["rawImage"],
            "properties": {"rawImage": {
                "type": "object", "additionalProperties": False,
                "properties": {"start": {
                    "type": "object", "additionalProperties": False, "required": ["argv"],
                    # The first element is the executable and must not be empty.
                    "properties": {"argv": {"type": "array", "minItems": 1,
                                            "prefixItems": [{"minLength": 1}],
                                            "items": {"type": "string"}}}}}}}},
        "labels": {"type": "object", "maxProperties": 64,
                   "additionalProperties": {"type": "string"}},
        "features": {
            "type": "object", "additionalProperties": False,
            "properties": {"timeouts": {
                "type": "object", "additionalProperties": False,
                "properties": {
                    "timeout": DURATION,
                    "onTimeout": {"enum": ["delete", "stop", "keep", "restart", None]},
                    "autoResume": {"type": ["boolean", "null"]}}}}},
        "image": {"type": "string", "pattern": r"^images/[^/]+$"},
        "imageRef": {"type": "string"},
    },
    # Unknown fields anywhere are refused; image excludes imageRef, and
    # displayName excludes displayNamePrefix.
    "additionalProperties": False,
    "not": {"anyOf": [{"required": ["image", "imageRef"]},
                      {"required": ["displayName", "displayNamePrefix"]}]},
}

ENDPOINT = {
    "type": "object",
    "required": ["sandbox", "sandboxUid", "apiVersion", "capabilities", "authentication"],
    "properties": {
        "uri": {"type": "string"},
        "protocol": {"enum": ["unspecified", "http", "unixSocket"]},
        "credentialAudience": {"type": "string"},
        "sandbox": {"type": "string", "pattern": r"^sandboxes/[^/]+$"},
        "sandboxUid": {"type": "string", "minLength": 1},
        "apiVersion": {"const": "v1"},
        "capabilities": {"type": "array", "minItems": 1, "uniqueItems": True,
                         "items": {"type": "string", "pattern": r"^[a-z][A-Za-z0-9]*$"}},
        "authentication": {
            "type": "object", "required": ["scheme"],
            "properties": {"scheme": {"enum": ["scopedBearer", "localSocket"]},
                           "defaultTtl": DURATION, "maxTtl": DURATION},
            "if": {"properties": {"scheme": {"const": "scopedBearer"}}},
            "then": {"required": ["defaultTtl", "maxTtl"],
                     "properties": {"defaultTtl": {"pattern": r"^300([.]0{1,9})?s$"},
                                    "maxTtl": {"pattern": r"^300([.]0{1,9})?s$"}}}},
    },
    "if": {"properties": {"protocol": {"const": "http"}}, "required": ["protocol"]},
    "then": {"required": ["credentialAudience"],
             "properties": {"credentialAudience": {"minLength": 1}}},
}

ERROR = {
    "type": "object", "required": ["code"],
    "properties": {
        "code": {"type": "string"},
        "message": {"type": "string"},
        "details": {"type": "array", "items": {"type": "object", "required": ["@type"],
                                               "properties": {"@type": {"type": "string"}}}},
    },
}

EFFECTIVE_TIMEOUTS = {
    "type": "object", "required": ["onTimeout", "initialTimeout"],
    "properties": {"onTimeout": {"enum": ["delete", "stop", "keep", "restart"]},
                   "autoResume": {"type": "boolean"},
                   "initialTimeout": DURATION,
                   "expiresAt": TIMESTAMP,
                   "resumeTimeout": DURATION},
}

EFFECTIVE_FEATURES = {
    "type": "object", "required": ["lifecycle", "outputRetention"],
    "properties": {
        "lifecycle": {"type": "object", "required": ["stopMemoryOutcome"],
                      "properties": {"stopMemoryOutcome": {"enum": ["discard", "preserve"]},
                                     "canCaptureMemory": {"type": "boolean"}}},
        # A retention needs a duration or a byte floor; a byte floor is zero
        # or at least 64 KiB.
        "outputRetention": {"type": "object",
                            "properties": {"minDuration": DURATION, "minBytes": INT64},
                            "anyOf": [{"required": ["minDuration"]},
                                      {"required": ["minBytes"]}]},
        "timeouts": EFFECTIVE_TIMEOUTS,
    },
}

SANDBOX = {
    "type": "object", "required": ["core", "name", "uid"],
    # failure is present only while the status is failed.
    "if": {"required": ["failure"]},
    "then": {"properties": {"core": {"properties": {"status": {"const": "failed"}}}}},
    "properties": {
        "name": {"type": "string", "pattern": r"^sandboxes/[^/]+$"},
        "uid": {"type": "string", "minLength": 1},
        "displayName": {"type": "string"},
        "effectiveFeatures": EFFECTIVE_FEATURES,
        "failure": ERROR,
        "core": {
            "type": "object", "required": ["status", "createdAt", "etag"],
            "properties": {
                "status": STATUS,
                "createdAt": TIMESTAMP,
                "etag": {"type": "string", "minLength": 1, "pattern": r'^"[^"\x00-\x20\x7f]*"$'},
                "resources": RESOURCES,
                "platform": PLATFORM,
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "endpoint": ENDPOINT,
                "imageRef": {"type": "string"},
                "image": {"type": "string", "pattern": r"^images/[^/]+$"},
            },
            "not": {"required": ["image", "imageRef"]},
        },
    },
}

def _with_status(statuses: "list[str]", present: bool) -> dict:
    """SANDBOX, with its status among `statuses` (or, not `present`, not)."""
    rule = {"properties": {"core": {"properties": {"status": {"enum": statuses}},
                                    "required": ["status"]}},
            "required": ["core"]}
    return {"allOf": [SANDBOX, rule if present else {"not": rule}]}


# What each success of a create and a delete may carry: a 201 is past
# creating and starting, a 202 is still there; a delete's 202 is deleting.
CREATE_DONE = _with_status(["creating", "starting"], present=False)
CREATE_ACCEPTED = _with_status(["creating", "starting"], present=True)
DELETE_ACCEPTED = _with_status(["deleting"], present=True)

LIST_ANSWER = {
    "type": "object",
    "properties": {"sandboxes": {"type": "array", "items": SANDBOX},
                   "nextPageToken": {"type": "string"}},
}

RULE = {"type": "object", "properties": {
    "network": {"type": "string"},
    "layer": {"enum": ["unspecified", "org", "owner", "kit", "attached", "gateway", "default"]}}}

POLICIES_ANSWER = {
    "type": "object", "required": ["effective", "exact"],
    "properties": {
        "effective": {
            "type": "object", "required": ["mode"],
            "properties": {"mode": {"enum": ["allowAll", "denyAll"]},
                           "allowNetworks": {"type": "array", "items": RULE},
                           "denyNetworks": {"type": "array", "items": RULE}}},
        "exact": {
            "type": "object", "required": ["revision", "selectorVersion", "nodes"],
            "properties": {"revision": {"type": "string", "minLength": 1},
                           "selectorVersion": {"const": "destination.v1"},
                           "nodes": {"type": "array", "minItems": 1, "maxItems": 256}}},
    },
}

CREDENTIAL_REQUEST = {
    "type": "object", "additionalProperties": False, "required": ["permissions"],
    "properties": {"permissions": {"type": "array", "minItems": 1, "uniqueItems": True,
                                   "items": ENDPOINT_PERMISSION},
                   "ttl": DURATION},
}

CREDENTIAL_ANSWER = {
    "type": "object", "required": ["token", "expireTime", "permissions", "sandbox", "audience"],
    "properties": {"token": {"type": "string", "minLength": 1},
                   "expireTime": TIMESTAMP,
                   "permissions": {"type": "array", "minItems": 1, "uniqueItems": True,
                                   "items": ENDPOINT_PERMISSION},
                   "sandbox": {"type": "string", "pattern": r"^sandboxes/[^/]+$"},
                   "audience": {"type": "string", "minLength": 1}},
}

EXEC_REQUEST = {
    "type": "object", "additionalProperties": False, "required": ["cmd"],
    "properties": {"cmd": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                   "env": {"type": "object", "additionalProperties": {"type": "string"}},
                   "workingDir": {"type": "string"},
                   "user": {"type": "string"}},
}

EXEC_ANSWER = {
    "type": "object",
    "properties": {"exitCode": {"type": "integer", "minimum": -2**31, "maximum": 2**31 - 1},
                   "stdout": {"type": "string", "contentEncoding": "base64"},
                   "stderr": {"type": "string", "contentEncoding": "base64"},
                   "incomplete": {"type": "boolean"}},
}

FILE_HEADER = {
    "type": "object", "additionalProperties": False, "required": ["path"],
    "properties": {"path": {"type": "string", "minLength": 1}, "mode": {"type": "integer"}},
}

FILE_ERROR = {"type": "object", "required": ["failure"],
              "properties": {"path": {"type": "string"}, "failure": ERROR}}

UPLOAD_ANSWER = {"type": "object", "properties": {"filesWritten": {"type": "integer"}}}

TOKEN_EXCHANGE_REQUEST = {
    "type": "object", "required": ["identifier", "secret"],
    "properties": {"identifier": {"type": "string", "minLength": 1},
                   "secret": {"type": "string", "minLength": 1}},
}

_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


def problems(schema: dict, value) -> "list[str]":
    """Every way `value` breaks `schema`, as short readable lines."""
    validator = jsonschema.Draft202012Validator(schema, format_checker=_CHECKER)
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message[:200]}"
            for e in validator.iter_errors(value)]
