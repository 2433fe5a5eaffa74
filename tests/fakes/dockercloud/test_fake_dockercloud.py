"""fake-dockercloud on its own, driven by a plain HTTPS client: the rules
Docker's document states hold, and the shape check catches what breaks it
(a check that never fails would prove nothing)."""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import ssl
import subprocess
import sys
import time
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "e2b"))
sys.path.insert(0, str(HERE))
import certs as fake_certs  # noqa: E402
import shapes  # noqa: E402
from fake_dockercloud import PLACED, FakeDockerCloud  # noqa: E402

USER, PAT = "someone", "dckr_pat_test"


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    ca, leaf, key = fake_certs.make(d)
    f = FakeDockerCloud(USER, PAT, tls=(str(leaf), str(key))).start()
    f.ca = str(ca)
    yield f
    f.stop()


def call(fake, method, path, body=None, headers=None, host="127.0.0.1"):
    conn = http.client.HTTPSConnection(host, fake.port,
                                       context=ssl.create_default_context(cafile=fake.ca))
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    h = dict(headers or {})
    if data is not None and "Content-Type" not in h:
        h["Content-Type"] = "application/json"
    conn.request(method, path, data, h)
    r = conn.getresponse()
    raw = r.read()
    conn.close()
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = raw
    return r.status, dict(r.getheaders()), parsed


def exchange(fake, body):
    conn = http.client.HTTPSConnection("127.0.0.1", fake.exchange_port,
                                       context=ssl.create_default_context(cafile=fake.ca))
    conn.request("POST", "/v2/auth/token", json.dumps(body).encode(),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    answer = (r.status, json.loads(r.read()))
    conn.close()
    return answer


def bearer(fake) -> dict:
    status, body = exchange(fake, {"identifier": USER, "secret": PAT})
    assert status == 200
    return {"Authorization": f"Bearer {body['access_token']}"}


CREATE = {"displayName": "t1", "imageRef": "docker.io/library/node:22-bookworm-slim",
          "platform": {"os": "linux", "architecture": "amd64"},
          "resources": {"cpus": 1, "memoryMib": 2048},
          "startupExecution": {"rawImage": {"start": {"argv": ["tail", "-f", "/dev/null"]}}},
          "features": {"timeouts": {"timeout": "60s", "onTimeout": "delete", "autoResume": False}}}


def test_the_exchange_takes_only_the_right_secret(fake):
    status, _ = exchange(fake, {"identifier": USER, "secret": "no"})
    assert status == 401
    # The exchange is its own origin: the API's does not serve it.
    assert call(fake, "POST", "/v2/auth/token", {"identifier": USER, "secret": PAT})[0] == 404
    status, _, _ = call(fake, "GET", "/sandboxes/v1/sandboxes")
    assert status == 401
    status, _, body = call(fake, "GET", "/sandboxes/v1/sandboxes", headers=bearer(fake))
    assert status == 200 and "sandboxes" in body


def test_a_whole_run_follows_the_document(fake):
    auth = bearer(fake)
    status, headers, sb = call(fake, "POST", "/sandboxes/v1/sandboxes", CREATE,
                               {**auth, "Idempotency-Key": "k1"})
    assert status == 201 and headers["ETag"] == sb["core"]["etag"]
    uid = sb["uid"]
    # The same key and body replay the sandbox; another body is refused.
    assert call(fake, "POST", "/sandboxes/v1/sandboxes", CREATE,
                {**auth, "Idempotency-Key": "k1"})[2]["uid"] == uid
    assert call(fake, "POST", "/sandboxes/v1/sandboxes", {**CREATE, "displayName": "t2"},
                {**auth, "Idempotency-Key": "k1"})[0] == 409
    status, _, pol = call(fake, "GET", f"/sandboxes/v1/sandboxes/{uid}/network-policies",
                          headers=auth)
    assert pol["effective"] == {"mode": "denyAll", "allowNetworks": []}
    status, headers, cred = call(fake, "POST",
                                 f"/sandboxes/v1/sandboxes/{uid}/endpoint-credentials",
                                 {"permissions": ["sandboxesExec", "sandboxesFilesWrite",
                                                  "sandboxesFilesRead"], "ttl": "300s"},
                                 auth)
    assert status == 200 and headers["Cache-Control"] == "no-store"
    ep_path = "/" + sb["core"]["endpoint"]["uri"].split("/", 3)[3]
    ep = {"Authorization": f"Bearer {cred['token']}"}
    # The management token is refused at the endpoint, and counted.
    assert call(fake, "POST", f"{ep_path}/v1/processes/exec", {"cmd": ["true"]}, auth,
                host="localhost")[0] == 401
    assert fake.state()["management_token_on_endpoint"] == 1
    fake.counts["management_token_on_endpoint"] = 0
    # An upload makes no directory: the client makes it first.
    assert call(fake, "POST", f"{ep_path}/v1/processes/exec", {"cmd": ["mkdir", "/tmp/x"]}, ep,
                host="localhost")[:3:2] == (200, {})
    form = (b"--b\r\nContent-Disposition: form-data; name=\"metadata\"\r\n"
            b"Content-Type: application/json\r\n\r\n{\"path\": \"/tmp/x/a.txt\", \"mode\": 420}\r\n"
            b"--b\r\nContent-Disposition: form-data; name=\"content\"\r\n"
            b"Content-Type: application/octet-stream\r\n\r\nhello\r\n--b--\r\n")
    status, _, up = call(fake, "POST", f"{ep_path}/v1/files/upload", form,
                         {**ep, "Content-Type": "multipart/form-data; boundary=b"},
                         host="localhost")
    assert (status, up) == (200, {"filesWritten": 1})
    status, _, out = call(fake, "POST", f"{ep_path}/v1/processes/exec",
                          {"cmd": ["sh", "-c", "cat a.txt; exit 3"], "workingDir": "/tmp/x"},
                          ep, host="localhost")
    assert base64.b64decode(out["stdout"]) == b"hello" and out["exitCode"] == 3
    status, headers, raw = call(fake, "GET",
                                f"{ep_path}/v1/files/download?paths=/tmp/x/a.txt&paths=/nope",
                                headers=ep, host="localhost")
    assert headers["Content-Type"].startswith("multipart/mixed")
    assert b"name=metadata" in raw and b"hello" in raw and b"name=error" in raw
    # Delete: If-Match required, a stale one refused; then 202 with the
    # deleting sandbox, which reads as deleting until it is gone; absent is 204.
    path = f"/sandboxes/v1/sandboxes/{uid}?force=true"
    assert call(fake, "DELETE", path, headers=auth)[0] == 428
    assert call(fake, "DELETE", path, headers={**auth, "If-Match": '"stale"'})[0] == 412
    etag = call(fake, "GET", f"/sandboxes/v1/sandboxes/{uid}", headers=auth)[1]["ETag"]
    status, headers, deleting = call(fake, "DELETE", path, headers={**auth, "If-Match": etag})
    assert status == 202 and deleting["core"]["status"] == "deleting"
    assert "endpoint" not in deleting["core"] and headers["ETag"] == deleting["core"]["etag"]
    status, _, read = call(fake, "GET", f"/sandboxes/v1/sandboxes/{uid}", headers=auth)
    assert status == 200 and read["core"]["status"] == "deleting"
    wait_gone(fake, auth, uid)
    assert call(fake, "DELETE", path, headers={**auth, "If-Match": etag})[0] == 204
    assert fake.state()["violations"] == []


def test_a_route_not_served_answers_a_page_not_json(fake):
    status, headers, body = call(fake, "GET", "/sandboxes/v2/anything", headers=bearer(fake))
    assert status == 404 and not isinstance(body, dict)
    status, _, _ = call(fake, "GET", "/elsewhere")
    assert status == 404


@pytest.mark.parametrize("bad", [
    {**CREATE, "networkPolicy": {}},                      # an unknown field
    {**CREATE, "displayName": "has space"},               # the name's pattern
    {**CREATE, "image": "images/x"},                      # image beside imageRef
    {**CREATE, "resources": {"cpus": 1, "gpus": 1}},      # unknown inside resources
    {**CREATE, "features": {"timeouts": {"timeout": "60"}}},  # not a duration
])
def test_a_request_off_the_document_is_refused_and_recorded(fake, bad):
    before = len(fake.state()["violations"])
    status, _, body = call(fake, "POST", "/sandboxes/v1/sandboxes", bad, bearer(fake))
    assert status == 400 and body["code"] == "invalidArgument"
    assert len(fake.state()["violations"]) > before
    fake.violations.clear()


def test_the_shapes_catch_an_answer_off_the_document():
    good = {"uid": "u", "name": "sandboxes/u",
            "core": {"status": "running", "createdAt": "2026-01-01T00:00:00Z", "etag": '"e"'}}
    assert shapes.problems(shapes.SANDBOX, good) == []
    for broken in [{**good, "name": "u"},
                   {**good, "core": {**good["core"], "status": "sleeping"}},
                   {**good, "core": {**good["core"], "etag": "unquoted"}},
                   {k: v for k, v in good.items() if k != "uid"}]:
        assert shapes.problems(shapes.SANDBOX, broken), broken
    assert shapes.problems(shapes.EXEC_ANSWER, {"exitCode": 2**31})
    assert shapes.problems(shapes.CREDENTIAL_ANSWER, {"token": "t"})


# ---- documented behaviour beyond the shapes -------------------------------------------------

ALL = ["sandboxesExec", "sandboxesFilesWrite", "sandboxesFilesRead"]


def create(fake, auth, body=None, key=None):
    headers = {**auth, **({"Idempotency-Key": key} if key else {})}
    return call(fake, "POST", "/sandboxes/v1/sandboxes", CREATE if body is None else body,
                headers)


def wait_gone(fake, auth, uid, within=15.0):
    end = time.time() + within
    while time.time() < end:
        if call(fake, "GET", f"/sandboxes/v1/sandboxes/{uid}", headers=auth)[0] == 404:
            return
        time.sleep(0.1)
    raise AssertionError(f"sandbox {uid} still there after {within} s")


def remove(fake, auth, uid):
    """Deletes as a client must: the current ETag, then read until gone."""
    status, headers, _ = call(fake, "GET", f"/sandboxes/v1/sandboxes/{uid}", headers=auth)
    if status == 404:
        return
    status, _, _ = call(fake, "DELETE", f"/sandboxes/v1/sandboxes/{uid}?force=true",
                        headers={**auth, "If-Match": headers["ETag"]})
    assert status in (202, 204)
    wait_gone(fake, auth, uid)


def endpoint(fake, auth, sb, permissions=ALL):
    """The sandbox endpoint's path and a credential for it."""
    status, _, cred = call(fake, "POST",
                           f"/sandboxes/v1/sandboxes/{sb['uid']}/endpoint-credentials",
                           {"permissions": list(permissions)}, auth)
    assert status == 200
    return ("/" + sb["core"]["endpoint"]["uri"].split("/", 3)[3],
            {"Authorization": f"Bearer {cred['token']}"})


def run(fake, ep, argv, **extra):
    path, headers = ep
    return call(fake, "POST", f"{path}/v1/processes/exec", {"cmd": argv, **extra}, headers,
                host="localhost")


def read(fake, auth, uid):
    return call(fake, "GET", f"/sandboxes/v1/sandboxes/{uid}", headers=auth)[2]


def stamp(text):
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_the_deadline_is_armed_at_first_readiness_not_at_create(fake):
    auth = bearer(fake)
    before = fake.state()["ttl_reaped"]
    fake.set_fault("create_202", polls=2)
    body = {**CREATE, "displayName": "ttl",
            "features": {"timeouts": {"timeout": "2s", "onTimeout": "delete"}}}
    status, _, sb = create(fake, auth, body)
    assert status == 202 and sb["core"]["status"] == "creating"
    timeouts = sb["effectiveFeatures"]["timeouts"]
    assert timeouts["initialTimeout"] == "2s" and "expiresAt" not in timeouts
    time.sleep(3)  # longer than the TTL, counted from the create
    assert read(fake, auth, sb["uid"])["core"]["status"] == "creating"
    ready = read(fake, auth, sb["uid"])
    assert ready["core"]["status"] == "running"
    # Armed now, at the first read that found it running.
    assert stamp(ready["effectiveFeatures"]["timeouts"]["expiresAt"]) > time.time() + 1
    wait_gone(fake, auth, sb["uid"], within=6)
    assert fake.state()["ttl_reaped"] == before + 1
    assert fake.state()["violations"] == []


def test_the_start_argv_is_the_main_process_and_its_end_fails_the_sandbox(fake):
    auth = bearer(fake)
    body = {**CREATE, "displayName": "main", "startupExecution": {
        "rawImage": {"start": {"argv": ["sh", "-c", "sleep 5; exit 3"]}}}}
    status, _, sb = create(fake, auth, body)
    assert status == 201 and sb["core"]["status"] == "running"
    ep = endpoint(fake, auth, sb)
    _, _, out = run(fake, ep, ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])
    assert b"sleep 5; exit 3" in base64.b64decode(out["stdout"])
    end = time.time() + 15
    while read(fake, auth, sb["uid"])["core"]["status"] == "running" and time.time() < end:
        time.sleep(0.2)
    failed = read(fake, auth, sb["uid"])
    assert failed["core"]["status"] == "failed" and "status 3" in failed["failure"]["message"]
    assert "endpoint" not in failed["core"] and failed["core"]["etag"] != sb["core"]["etag"]
    status, _, refused = run(fake, ep, ["true"])
    assert status == 409 and refused["code"] == "failedPrecondition"
    remove(fake, auth, sb["uid"])
    assert fake.state()["violations"] == []


def test_without_a_start_argv_the_image_command_runs(fake):
    # The fake's image names no command of its own: nothing can start.
    auth = bearer(fake)
    body = {k: v for k, v in CREATE.items() if k != "startupExecution"}
    status, _, sb = create(fake, auth, {**body, "displayName": "nostart"})
    assert status == 201 and sb["core"]["status"] == "failed"
    assert sb["failure"]["code"] == "aborted" and "endpoint" not in sb["core"]
    remove(fake, auth, sb["uid"])
    assert fake.state()["violations"] == []


def test_a_sandbox_being_created_is_deleted_only_with_force(fake):
    auth = bearer(fake)
    fake.set_fault("create_202", polls=50)
    status, headers, sb = create(fake, auth, {**CREATE, "displayName": "early"})
    assert status == 202
    path = f"/sandboxes/v1/sandboxes/{sb['uid']}"
    status, _, body = call(fake, "DELETE", path, headers={**auth, "If-Match": headers["ETag"]})
    assert status == 409 and body["code"] == "failedPrecondition"
    status, _, body = call(fake, "DELETE", path + "?force=true",
                           headers={**auth, "If-Match": headers["ETag"]})
    assert status == 202 and body["core"]["status"] == "deleting"
    wait_gone(fake, auth, sb["uid"])
    # The knob: a delete that finishes at once.
    status, headers, sb = create(fake, auth, {**CREATE, "displayName": "quick"})
    fake.set_fault("delete_204")
    assert call(fake, "DELETE", f"/sandboxes/v1/sandboxes/{sb['uid']}",
                headers={**auth, "If-Match": headers["ETag"]})[0] == 204
    assert call(fake, "GET", f"/sandboxes/v1/sandboxes/{sb['uid']}", headers=auth)[0] == 404
    assert fake.state()["violations"] == []


def test_the_endpoint_lists_what_it_serves_and_a_credential_grants_only_its_permissions(fake):
    auth = bearer(fake)
    status, _, sb = create(fake, auth, {**CREATE, "displayName": "caps"})
    assert sb["core"]["endpoint"]["capabilities"] == ["download", "exec", "upload"]
    ep = endpoint(fake, auth, sb, ["sandboxesFilesRead"])
    status, _, body = run(fake, ep, ["true"])
    assert status == 403 and body["code"] == "permissionDenied"
    path, headers = ep
    status, _, body = call(fake, "POST", f"{path}/v1/files/upload", b"--b--\r\n",
                           {**headers, "Content-Type": "multipart/form-data; boundary=b"},
                           host="localhost")
    assert status == 403
    status, _, _ = call(fake, "GET", f"{path}/v1/files/download?paths=/etc/hostname",
                        headers=headers, host="localhost")
    assert status == 200
    # An operation the endpoint does not list is not served.
    status, _, body = call(fake, "GET", f"{path}/v1/files?path=/", headers=headers,
                           host="localhost")
    assert status == 404 and not isinstance(body, dict)
    remove(fake, auth, sb["uid"])


def test_a_replay_returns_the_first_result_after_unknown_fields_are_refused(fake):
    auth = bearer(fake)
    body = {**CREATE, "displayName": "replayed"}
    status, _, first = create(fake, auth, body, key="replay-1")
    assert status == 201
    remove(fake, auth, first["uid"])
    created = fake.state()["created"]
    status, headers, again = create(fake, auth, body, key="replay-1")
    assert (status, again) == (201, first) and headers["ETag"] == first["core"]["etag"]
    assert fake.state()["created"] == created  # nothing new was made
    # Unknown fields are refused before the key is looked up.
    status, _, refused = create(fake, auth, {**body, "bogus": 1}, key="replay-1")
    assert status == 400 and refused["code"] == "invalidArgument"
    fake.violations.clear()


def test_what_a_create_leaves_out_is_reported_only_as_chosen(fake):
    auth = bearer(fake)
    body = {k: v for k, v in CREATE.items() if k not in ("resources", "platform")}
    status, _, sb = create(fake, auth, {**body, "displayName": "bare"})
    assert status == 201 and "resources" not in sb["core"]
    assert sb["core"]["platform"] == PLACED
    assert "timeouts" in sb["effectiveFeatures"]
    remove(fake, auth, sb["uid"])
    for bad in [{**CREATE, "platform": {"os": "linux"}},
                {**CREATE, "platform": {"os": "windows", "architecture": "amd64"}},
                {**CREATE, "features": {"timeouts": {"timeout": "60s", "onTimeout": "stop"}}},
                {**CREATE, "features": {"timeouts": {"timeout": "0s"}}},
                {**CREATE, "startupExecution": {"rawImage": {"start": {"argv": [""]}}}}]:
        assert create(fake, auth, bad)[0] == 400, bad
    fake.violations.clear()


def multipart(files, close=True):
    out = b""
    for path, mode, data in files:
        out += (b"--b\r\nContent-Disposition: form-data; name=\"metadata\"\r\n"
                b"Content-Type: application/json\r\n\r\n"
                + json.dumps({"path": path, "mode": mode}).encode() + b"\r\n"
                b"--b\r\nContent-Disposition: form-data; name=\"content\"\r\n"
                b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n")
    return out + (b"--b--\r\n" if close else b"")


def test_an_upload_applies_its_mode_and_a_download_reports_what_is_stored(fake):
    auth = bearer(fake)
    status, _, sb = create(fake, auth, {**CREATE, "displayName": "files"})
    ep = endpoint(fake, auth, sb)
    path, headers = ep
    form = {**headers, "Content-Type": "multipart/form-data; boundary=b"}

    def upload(files, close=True):
        return call(fake, "POST", f"{path}/v1/files/upload", multipart(files, close), form,
                    host="localhost")

    # An upload makes no directory.
    status, _, body = upload([("/tmp/none/a", 420, b"x")])
    assert status == 404 and body["code"] == "notFound"
    run(fake, ep, ["mkdir", "-p", "/tmp/m"])
    assert upload([("/tmp/m/a", 0o600, b"A"), ("/tmp/m/b", 0, b"B")])[2] == {"filesWritten": 2}
    _, _, out = run(fake, ep, ["stat", "-c", "%a", "/tmp/m/a", "/tmp/m/b"])
    assert base64.b64decode(out["stdout"]) == b"600\n644\n"
    status, _, body = upload([("/tmp/m", 420, b"x")])
    assert status == 409 and body["code"] == "failedPrecondition"
    assert upload([("/tmp/m/c", 420, b"C")], close=False)[0] == 400
    status, answer_headers, raw = call(
        fake, "GET", f"{path}/v1/files/download?paths=/tmp/m/a&paths=/tmp/m/b&paths=/tmp/m"
        "&paths=/tmp/m/./a&paths=/tmp/m/nope", headers=headers, host="localhost")
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + answer_headers["Content-Type"].encode() + b"\r\n\r\n" + raw)
    parts = [(p.get_param("name", header="content-disposition"), p.get_payload(decode=True))
             for p in message.iter_parts()]
    meta = [json.loads(d) for n, d in parts if n == "metadata"]
    errors = [json.loads(d) for n, d in parts if n == "error"]
    assert meta == [{"path": "/tmp/m/a", "mode": 0o600}, {"path": "/tmp/m/b", "mode": 0o644}]
    assert [(e["path"], e["failure"]["code"]) for e in errors] == [
        ("/tmp/m", "failedPrecondition"), ("/tmp/m/./a", "invalidArgument"),
        ("/tmp/m/nope", "notFound")]
    remove(fake, auth, sb["uid"])
    assert fake.state()["violations"] == []


def test_a_list_pages_at_most_fifty_with_tokens_that_do_not_shift(fake):
    auth = bearer(fake)
    planted = [fake.plant({"listed": "yes"}) for _ in range(60)]
    try:
        status, _, page1 = call(fake, "GET", "/sandboxes/v1/sandboxes?pageSize=100",
                                headers=auth)
        assert status == 200 and len(page1["sandboxes"]) == 50 and page1["nextPageToken"]
        # One listed on the first page goes; the second page does not shift.
        fake._remove(fake.sandboxes[page1["sandboxes"][10]["uid"]])
        status, _, page2 = call(fake, "GET", "/sandboxes/v1/sandboxes?pageSize=100&pageToken="
                                + page1["nextPageToken"], headers=auth)
        seen = [s["uid"] for s in page1["sandboxes"] + page2["sandboxes"]]
        assert len(set(seen)) == len(seen) and set(planted) <= set(seen)
        assert page2["nextPageToken"] == ""
        status, _, one = call(fake, "GET", "/sandboxes/v1/sandboxes?filter=name%3Dsandboxes/"
                              + planted[0], headers=auth)
        assert [s["uid"] for s in one["sandboxes"]] == [planted[0]]
        for query in ["pageToken=bogus", "pageSize=-1", "filter=labels%3Dx", "filter=uid"]:
            status, _, body = call(fake, "GET", f"/sandboxes/v1/sandboxes?{query}",
                                   headers=auth)
            assert status == 400 and body["code"] == "invalidArgument", query
    finally:
        for uid in planted:
            if uid in fake.sandboxes:
                fake._remove(fake.sandboxes[uid])
    assert fake.state()["violations"] == []


# ---- the network follows the effective policy -----------------------------------------------

def network_of(fake, uid):
    """(docker's network mode, the interfaces inside) of a sandbox's container."""
    container = fake.sandboxes[uid].container
    mode = subprocess.run(["docker", "inspect", "-f", "{{.HostConfig.NetworkMode}}", container],
                          capture_output=True, text=True, check=True).stdout.strip()
    inside = subprocess.run(["docker", "exec", container, "ls", "/sys/class/net"],
                            capture_output=True, text=True, check=True).stdout.split()
    return mode, inside


def policy_of(fake, auth, uid):
    status, _, pol = call(fake, "GET", f"/sandboxes/v1/sandboxes/{uid}/network-policies",
                          headers=auth)
    assert status == 200
    return pol


@pytest.mark.parametrize("inline, effective, network", [
    (None, {"mode": "denyAll", "allowNetworks": []}, "none"),  # the fail-closed default
    ([], {"mode": "denyAll", "allowNetworks": []}, "none"),
    ([{"mode": "denyAll"}], {"mode": "denyAll", "allowNetworks": []}, "none"),
    ([{"mode": "denyAll", "denyNetworks": ["10.0.0.0/8"]}],
     {"mode": "denyAll", "allowNetworks": [],
      "denyNetworks": [{"network": "10.0.0.0/8", "layer": "attached"}]}, "none"),
    ([{"mode": "denyAll", "allowNetworks": ["1.1.1.1/32", "example.com"]}],
     {"mode": "denyAll", "allowNetworks": [{"network": "1.1.1.1/32", "layer": "attached"},
                                           {"network": "example.com", "layer": "attached"}]},
     "bridge"),
])
def test_the_container_network_follows_the_effective_policy(fake, inline, effective, network):
    auth = bearer(fake)
    body = {**CREATE, "displayName": "net"}
    if inline is not None:
        body["networkPolicies"] = inline
    status, _, sb = create(fake, auth, body)
    assert status == 201, sb
    pol = policy_of(fake, auth, sb["uid"])
    assert pol["effective"] == effective
    assert pol["exact"]["nodes"][0]["constant"] == "false"
    mode, interfaces = network_of(fake, sb["uid"])
    assert mode == network
    assert ("eth0" in interfaces) == (network == "bridge") and "lo" in interfaces
    remove(fake, auth, sb["uid"])
    assert fake.state()["violations"] == []


@pytest.mark.parametrize("knob, effective", [
    ("policy_allow_all", {"mode": "allowAll", "allowNetworks": []}),
    ("policy_extra_rule", {"mode": "denyAll",
                           "allowNetworks": [{"network": "example.com", "layer": "org"}]}),
])
def test_a_policy_knob_opens_the_sandbox_it_describes(fake, knob, effective):
    """Taken at the create: every read of that sandbox says so, and its
    container has the way out the policy grants."""
    auth = bearer(fake)
    fake.set_fault(knob)
    status, _, sb = create(fake, auth, {**CREATE, "displayName": "knob"})
    assert status == 201
    for _ in range(2):
        assert policy_of(fake, auth, sb["uid"])["effective"] == effective
    assert network_of(fake, sb["uid"])[0] == "bridge"
    # The next sandbox is back to the default.
    status, _, other = create(fake, auth, {**CREATE, "displayName": "after"})
    assert policy_of(fake, auth, other["uid"])["effective"]["mode"] == "denyAll"
    assert network_of(fake, other["uid"])[0] == "none"
    for uid in (sb["uid"], other["uid"]):
        remove(fake, auth, uid)
    assert fake.state()["violations"] == []


def test_egress_open_is_a_container_open_under_a_deny_all_policy(fake):
    auth = bearer(fake)
    fake.set_fault("egress_open")
    status, _, sb = create(fake, auth, {**CREATE, "displayName": "lie"})
    assert status == 201
    assert policy_of(fake, auth, sb["uid"])["effective"] == {"mode": "denyAll",
                                                             "allowNetworks": []}
    assert network_of(fake, sb["uid"])[0] == "bridge"
    remove(fake, auth, sb["uid"])


def test_an_inline_policy_the_fake_cannot_materialize_fails_before_the_create(fake):
    auth = bearer(fake)
    before = fake.state()["created"]
    for rules in (["*.example.com"], [""], [f"10.0.{i // 256}.{i % 256}" for i in range(200)]):
        body = {**CREATE, "displayName": "bad", "networkPolicies": [
            {"mode": "denyAll", "allowNetworks": rules}]}
        status, _, answer = create(fake, auth, body)
        assert status == 400 and answer["code"] == "invalidArgument", answer
    assert fake.state()["created"] == before
