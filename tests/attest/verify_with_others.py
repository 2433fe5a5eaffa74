"""Check a plimsoll attestation bundle with verifiers this project did not write.

`plimsoll attest verify` reads our envelopes with our own code, so a mistake in
how we write them could be matched by the same mistake in how we read them.
Here every envelope goes to securesystemslib's DSSE code and every payload to
in-toto-attestation's Statement v1 validator instead. A bundle that passes is
standard DSSE around standard in-toto statements, readable by anyone's tools,
not only by ours.

Line kinds: run, session-open, session-call, session-close, checkpoint.
Checked: each line's signed statement (and a receipt, with --daemon-pub)
verifies with the key, threshold 1; its payload is an in-toto Statement v1
that the validator accepts, with the subject name and predicate type its
kind calls for. A run's or session call's statements (and receipt) name its
record's recordSha256 as their subject and carry that record, the record
being at response.record for a run, response.run.record for a call. A
session open's or close's statement names response.session (the session's
fingerprint) as its subject. No session ID may be in a bundle: an open's or
close's response, or a call's request, holding sessionId or session_id is
refused. The chain of lines, the sessions' chains and the checkpoint's count
are our own format, left to `plimsoll attest verify`.

Tested with securesystemslib 1.6.0 and in-toto-attestation 0.9.3, the versions
scripts/setup.sh pins in .venv-attest:

    .venv-attest/bin/python tests/attest/verify_with_others.py BUNDLE KEY.pub

Exit 0 and "N envelopes verified", or exit 1 naming the line and envelope.
"""

import argparse
import copy
import hashlib
import json
import sys

from cryptography.hazmat.primitives import serialization
from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import STATEMENT_TYPE_URI, Statement
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

IN_TOTO = "application/vnd.in-toto+json"
# What each envelope must be about: subject name, predicate type.
EXPECTED = {
    "run": ("run-record", "urn:plimsoll:attest:run-record:v1"),
    "session-open": ("session", "urn:plimsoll:attest:session-open:v1"),
    "session-call": ("run-record", "urn:plimsoll:attest:run-record:v1"),
    "session-unanswered": ("run-record", "urn:plimsoll:attest:run-record:v1"),
    "session-close": ("session", "urn:plimsoll:attest:session-close:v1"),
    "checkpoint": ("bundle-line", "urn:plimsoll:attest:bundle-checkpoint:v1"),
    "receipt": ("run-record", "urn:plimsoll:attest:run-receipt:v1"),
    "close-receipt": ("session", "urn:plimsoll:attest:session-close-receipt:v1"),
}
KINDS = ("run", "session-open", "session-call", "session-unanswered", "session-close", "checkpoint")
# Where a line that carries a run record keeps the object holding its
# "record" and, when the daemon signs, its "receipt".
RUN_AT = {
    "run": ("response",),
    "session-call": ("response", "run"),
}
# Where a session line keeps the session's fingerprint, its subject.
SESSION_AT = {
    "session-open": ("response", "session"),
    "session-close": ("response", "session"),
}
# The part of a session line that must not hold the session's ID: the ID
# is a capability, so a bundle holding it hands the session to its reader.
NO_SESSION_ID = {
    "session-open": "response",
    "session-call": "request",
    "session-unanswered": "request",
    "session-close": "response",
}
SESSION_ID_KEYS = ("sessionId", "session_id")


def fail(message):
    print(f"verify_with_others: {message}", file=sys.stderr)
    sys.exit(1)


def dig(line, path):
    """line[path[0]][path[1]]..., or None where something on the way is missing."""
    at = line
    for key in path:
        at = at.get(key) if isinstance(at, dict) else None
    return at


def about(line, kind):
    """What the line's statements must be about: (subject sha256, where it
    is, the record the predicate must carry or None); None for a checkpoint,
    whose subject is the previous line's bytes, and for an unanswered call,
    whose record is protobuf inside the line's error: both are left to our
    verify."""
    if kind in RUN_AT:
        where = ".".join(RUN_AT[kind] + ("record",))
        record = dig(line, RUN_AT[kind] + ("record",))
        if not isinstance(record, dict):
            raise ValueError(f"no record at {where}")
        return record.get("recordSha256"), f"{where}.recordSha256", record
    if kind in SESSION_AT:
        return dig(line, SESSION_AT[kind]), ".".join(SESSION_AT[kind]), None
    return None


def load_key(path):
    # securesystemslib 1.6 has no PEM reader for a public key (no
    # SSlibKey.from_pem); from_crypto is its way in. The key ID is ours:
    # SHA-256 of the key's SubjectPublicKeyInfo DER.
    try:
        with open(path, "rb") as f:
            public = serialization.load_pem_public_key(f.read())
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return SSlibKey.from_crypto(public, keyid=hashlib.sha256(der).hexdigest())


def check(envelope, key):
    """Verify one envelope with their code; return its statement as JSON."""
    # from_dict rewrites the signatures it is given, so give it a copy.
    env = Envelope.from_dict(copy.deepcopy(envelope))
    if env.payload_type != IN_TOTO:
        raise ValueError(f"payloadType {env.payload_type!r}, not {IN_TOTO}")
    try:
        env.verify([key], 1)
    except VerificationError as e:
        raise VerificationError(f"no signature verifies with key {key.keyid}: {e}") from e
    pb = json_format.Parse(env.payload, statement_pb2.Statement())
    if pb.type != STATEMENT_TYPE_URI:
        raise ValueError(f"_type {pb.type!r}, not {STATEMENT_TYPE_URI}")
    Statement.copy_from_pb(pb).validate()
    return json.loads(env.payload)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("pub", help="the signer's public key, PEM")
    parser.add_argument("--daemon-pub", help="the daemon's public key, PEM, for receipts")
    args = parser.parse_args()
    keys = {"signed": load_key(args.pub)}
    if args.daemon_pub:
        keys["receipt"] = load_key(args.daemon_pub)

    try:
        with open(args.bundle, "rb") as f:
            lines = f.read().split(b"\n")
    except OSError as e:
        fail(f"{args.bundle}: {e}")
    if lines[-1] == b"":
        lines.pop()
    if not lines:
        fail(f"{args.bundle}: empty")

    verified = 0
    for n, text in enumerate(lines, start=1):
        try:
            line = json.loads(text)
        except ValueError as e:
            fail(f"line {n}: not JSON: {e}")
        kind = line.get("kind") if isinstance(line, dict) else None
        if kind not in KINDS:
            fail(f"line {n}: kind {kind!r} is not one of {', '.join(KINDS)}")
        part = NO_SESSION_ID.get(kind)
        if part is not None and isinstance(line.get(part), dict):
            for key in SESSION_ID_KEYS:
                if key in line[part]:
                    fail(f"line {n}, {part}: holds {key}: a session ID in a bundle is a leak")
        # (envelope, key, subject name, predicate type) for each envelope the
        # line carries: its own statement, and a run record's receipt from
        # the daemon.
        envelopes = [(line.get("signed"), "signed") + EXPECTED[kind]]
        receipt = dig(line, RUN_AT[kind] + ("receipt",)) if kind in RUN_AT else None
        if receipt is not None:
            envelopes.append((receipt, "receipt") + EXPECTED["receipt"])
        # A session's close carries the daemon's receipt for its count.
        close_receipt = dig(line, ("response", "receipt")) if kind == "session-close" else None
        if close_receipt is not None:
            envelopes.append((close_receipt, "receipt") + EXPECTED["close-receipt"])
        for envelope, name, subject, predicate_type in envelopes:
            if envelope is None:
                fail(f"line {n}, {name}: missing")
            if name not in keys:
                fail(f"line {n}, {name}: receipt present but no daemon key given")
            try:
                statement = check(envelope, keys[name])
                if statement.get("predicateType") != predicate_type:
                    raise ValueError(f"predicateType {statement.get('predicateType')!r}, not {predicate_type}")
                names = [s.get("name") for s in statement["subject"]]
                if names != [subject]:
                    raise ValueError(f"subjects {names}, not [{subject!r}]")
                target = about(line, kind)
                if target is not None:
                    digest, where, record = target
                    if not isinstance(digest, str):
                        raise ValueError(f"no {where}")
                    got = [s.get("digest", {}).get("sha256") for s in statement["subject"]]
                    if got != [digest]:
                        raise ValueError(f"subject digest {got}, not the line's {where}")
                    if record is not None and statement["predicate"].get("record") != record:
                        raise ValueError("the predicate's record is not the line's record")
            except Exception as e:  # whatever their code or ours raised, name where
                fail(f"line {n}, {name}: {type(e).__name__}: {e}")
            verified += 1
    print(f"{verified} envelopes verified")


if __name__ == "__main__":
    main()
