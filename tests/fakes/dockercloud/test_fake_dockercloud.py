"""fake-dockercloud on its own, driven by a plain HTTPS client: the rules
Docker's document states hold, and the shape check catches what breaks it
(a check that never fails would prove nothing)."""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "e2b"))
sys.path.insert(0, str(HERE))
import certs as fake_certs  # noqa: E402
import shapes  # noqa: E402
from fake_dockercloud import FakeDockerCloud  # noqa: E402

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
    # Delete: If-Match required, a stale one refused, then gone; absent is 204.
    path = f"/sandboxes/v1/sandboxes/{uid}?force=true"
    assert call(fake, "DELETE", path, headers=auth)[0] == 428
    assert call(fake, "DELETE", path, headers={**auth, "If-Match": '"stale"'})[0] == 412
    etag = call(fake, "GET", f"/sandboxes/v1/sandboxes/{uid}", headers=auth)[1]["ETag"]
    assert call(fake, "DELETE", path, headers={**auth, "If-Match": etag})[0] == 204
    assert call(fake, "GET", f"/sandboxes/v1/sandboxes/{uid}", headers=auth)[0] == 404
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
