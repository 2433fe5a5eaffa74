"""fake-openshell driven by the stubs in OpenShell's own published Python
package (`openshell` 0.1.2, unmodified), over mutual TLS: create, wait
until ready, exec (server streaming and interactive), config and delete
all decode on both sides, so the fake's message tables match what
OpenShell publishes. The policy hash is checked against hashes a real
v0.1.2 gateway reported."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import grpc
import pytest
from openshell._proto import datamodel_pb2 as dm
from openshell._proto import openshell_pb2 as pb
from openshell._proto import openshell_pb2_grpc as pbg
from openshell._proto import sandbox_pb2 as sb

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "e2b"))
sys.path.insert(0, str(HERE))
import certs as fake_certs  # noqa: E402
import messages  # noqa: E402
from fake_openshell import FakeOpenShell  # noqa: E402

WS = dm.WorkspaceSelector(workspace="default")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    fake_certs.make(d)
    fake_certs.make_client(d)
    return d


@pytest.fixture(scope="module")
def fake(pki):
    f = FakeOpenShell(tls=(str(pki / "leaf.pem"), str(pki / "leaf.key")),
                      client_ca=str(pki / "ca.pem")).start()
    yield f
    f.stop()


def channel(fake, pki, client=True):
    creds = grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / "client.key").read_bytes() if client else None,
        certificate_chain=(pki / "client.pem").read_bytes() if client else None)
    return grpc.secure_channel(f"127.0.0.1:{fake.port}", creds)


def policy() -> sb.SandboxPolicy:
    return sb.SandboxPolicy(
        version=1,
        filesystem=sb.FilesystemPolicy(read_only=["/bin", "/usr"], read_write=["/tmp"]),
        landlock=sb.LandlockPolicy(compatibility="hard_requirement"))


def test_create_exec_delete_with_openshells_own_stubs(fake, pki):
    with channel(fake, pki) as ch:
        stub = pbg.OpenShellStub(ch)
        info = stub.GetGatewayInfo(pb.GetGatewayInfoRequest(), timeout=10)
        assert [d.capabilities.driver_name for d in info.compute_drivers] == ["docker"]
        assert info.compute_drivers[0].capabilities.resource_capabilities.memory.limit_supported
        spec = pb.SandboxSpec(template=pb.SandboxTemplate(image="node:22"), policy=policy())
        made = stub.CreateSandbox(pb.CreateSandboxRequest(
            workspace_scope=WS, name="stub-test", labels={"plimsoll.run": "1"}, spec=spec),
            timeout=30)
        assert made.sandbox.metadata.name == "stub-test" and made.sandbox.metadata.id
        assert made.sandbox.status.phase == pb.SANDBOX_PHASE_PROVISIONING
        for _ in range(20):
            got = stub.GetSandbox(pb.GetSandboxRequest(workspace_scope=WS, name="stub-test"),
                                  timeout=10)
            if got.sandbox.status.phase == pb.SANDBOX_PHASE_READY:
                break
            time.sleep(0.05)
        assert got.sandbox.status.phase == pb.SANDBOX_PHASE_READY
        assert got.sandbox.spec == spec and got.sandbox.metadata.labels["plimsoll.run"] == "1"
        config = stub.GetSandboxConfig(sb.GetSandboxConfigRequest(workspace_scope=WS,
                                                                  name="stub-test"), timeout=10)
        assert config.policy == policy()
        assert config.policy_source == sb.POLICY_SOURCE_SANDBOX
        assert config.configuration_admitted
        assert config.settings["agent_policy_proposals_enabled"].value.bool_value is False
        # The hash the fake states is OpenShell's identity of the policy
        # as these stubs serialize it (deterministically).
        raw = policy().SerializeToString(deterministic=True)
        assert config.policy_hash == messages.policy_hash(
            messages.decode(messages.SandboxPolicy, raw))
        events = list(stub.ExecSandbox(pb.ExecSandboxRequest(
            workspace_scope=WS, sandbox="stub-test", command=["sh", "-c", "cat; echo err >&2; exit 3"],
            stdin=b"from stdin\n"), timeout=30))
        kinds = [e.WhichOneof("payload") for e in events]
        assert kinds[-1] == "exit" and events[-1].exit.exit_code == 3
        assert b"".join(e.stdout.data for e in events if e.HasField("stdout")) == b"from stdin\n"
        assert b"".join(e.stderr.data for e in events if e.HasField("stderr")) == b"err\n"

        def frames():
            yield pb.ExecSandboxInput(start=pb.ExecSandboxRequest(
                workspace_scope=WS, sandbox="stub-test", command=["node", "-"], workdir="/tmp",
                no_login_shell=True))
            yield pb.ExecSandboxInput(stdin=b"console.log(process.cwd(), 6*7)")
        events = list(stub.ExecSandboxInteractive(frames(), timeout=30))
        assert b"".join(e.stdout.data for e in events if e.HasField("stdout")) == b"/tmp 42\n"
        assert events[-1].exit.exit_code == 0
        listed = stub.ListSandboxes(pb.ListSandboxesRequest(
            workspace_scope=WS, page_size=10, label_selector="plimsoll.run=1"), timeout=10)
        assert [s.metadata.name for s in listed.sandboxes] == ["stub-test"]
        gone = stub.DeleteSandbox(pb.DeleteSandboxRequest(workspace_scope=WS, name="stub-test"),
                                  timeout=30)
        assert gone.outcome == pb.DELETION_OUTCOME_COMPLETED
        with pytest.raises(grpc.RpcError) as e:
            stub.GetSandbox(pb.GetSandboxRequest(workspace_scope=WS, name="stub-test"), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        again = stub.DeleteSandbox(pb.DeleteSandboxRequest(workspace_scope=WS, name="stub-test",
                                                           allow_missing=True), timeout=10)
        assert again.outcome == pb.DELETION_OUTCOME_ALREADY_ABSENT
    assert fake.live() == []


def test_the_gateway_refuses_what_it_should(fake, pki):
    with channel(fake, pki) as ch:
        stub = pbg.OpenShellStub(ch)
        for request, code in [
            (pb.CreateSandboxRequest(workspace_scope=WS), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.CreateSandboxRequest(name="x"), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.CreateSandboxRequest(workspace_scope=WS, name="a-name-far-too-long-x"),
             grpc.StatusCode.INVALID_ARGUMENT),
        ]:
            with pytest.raises(grpc.RpcError) as e:
                stub.CreateSandbox(request, timeout=10)
            assert e.value.code() == code
    # Without the client certificate the handshake itself fails.
    with channel(fake, pki, client=False) as ch:
        with pytest.raises(grpc.RpcError) as e:
            pbg.OpenShellStub(ch).GetGatewayInfo(pb.GetGatewayInfoRequest(), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


# Hashes a real OpenShell v0.1.2 gateway reported for these policies.
GATEWAY_VECTORS = [
    (dict(ro=["/bin", "/usr", "/lib", "/etc", "/proc", "/dev/urandom", "/sys/fs/cgroup",
              "/runner.mjs"], rw=["/tmp", "/dev/null"], compat="hard_requirement"),
     "d1c56801c3fcf0b1d8473339f3b625b1cbf43d5401c1268026551dd28a39d871"),
    (dict(ro=["/bin", "/usr", "/lib", "/proc", "/dev/urandom", "/etc", "/var/log"],
          rw=["/tmp", "/dev/null"], compat="best_effort", include=True),
     "a45a8ff3564f00ae26cbd66f1131f37eedd8b54a66fbfec103d65a204c19c6e8"),
    (dict(ro=["/bin", "/usr", "/lib", "/proc", "/dev/urandom", "/etc", "/runner.mjs"],
          rw=["/sandbox/work", "/tmp", "/dev/null"], compat="best_effort"),
     "cb87d045a485ed8bbbd10c0580ef19f61a72312572b48664000d6c68014653bc"),
    (dict(ro=["/bin", "/usr", "/lib", "/proc", "/dev/urandom", "/etc", "/runner.mjs",
              "/sys/fs/cgroup"], rw=["/sandbox/work", "/tmp", "/dev/null"],
          compat="best_effort", process=("1000", "1000")),
     "a407726e71fc08e1452222192dafdfffe9676ce9c3c6ff3f6e7ae1d1ffd24917"),
]


@pytest.mark.parametrize("p,want", GATEWAY_VECTORS)
def test_the_policy_hash_is_the_gateways(p, want):
    policy = sb.SandboxPolicy(
        version=1,
        filesystem=sb.FilesystemPolicy(include_workdir=p.get("include", False),
                                       read_only=p["ro"], read_write=p["rw"]),
        landlock=sb.LandlockPolicy(compatibility=p["compat"]))
    if "process" in p:
        policy.process.run_as_user, policy.process.run_as_group = p["process"]
    ours = messages.decode(messages.SandboxPolicy, policy.SerializeToString(deterministic=True))
    assert messages.policy_hash(ours) == want
    # A policy with a network rule is never hashed here.
    policy.network_policies["x"].name = "x"
    assert messages.policy_hash(messages.decode(messages.SandboxPolicy,
                                                policy.SerializeToString())) is None
