"""Regenerates the golden digests in host/src/record.rs from the published
client's own functions (plimsoll-client 0.23.0), so the daemon's encoders are
checked against the code that will check them, not against a re-reading of it.

    python3 tests/compat/golden.py
"""

from plimsoll_client._record import record_digest, request_digest, result_digest
from plimsoll_client._wire import Msg
from plimsoll_client.types import RunRecord, SoftwareRule

req = {"protocol": 4, "minimumIsolation": "process", "timeoutMs": 1500, "javascript": {"code": "console.log(6*7)"}}
request = request_digest(req)
result = result_digest(Msg({"javascript": {"stdout": "NDIK"}}, "r"))
approved = SoftwareRule("approved", ("z:1", "a:2")).rule_id()
rec = RunRecord(
    version=4, request_sha256=request, result_sha256=result, provider="wasm", isolation="process",
    environment="quickjs-wasm:sha256:00", policy="", software_identity="quickjs-wasm:sha256:00",
    software_rule_id="", started_unix_ms=1_700_000_000_000, ended_unix_ms=1_700_000_000_005,
    session="", sequence=0, previous_sha256="", sha256="", unanswered="", instance="",
)
print(f'const GOLDEN_REQUEST: &str = "{request}";')
print(f'const GOLDEN_RESULT: &str = "{result}";')
print(f'const GOLDEN_APPROVED: &str = "{approved}";')
print(f'const GOLDEN_RECORD: &str = "{record_digest(rec)}";')

# A request with an approved software rule and a grant profile: the digest
# covers the rule's identities in the order sent (host/src/record.rs
# parses the snake_case, string-integer form of the same request).
req2 = {"protocol": 4, "softwareRule": {"mode": "approved", "identities": ["b:2", "a:1"]},
        "javascript": {"code": "x", "grantProfile": "inv"}}
print(f'const GOLDEN_REQUEST_RULE: &str = "{request_digest(req2)}";')
