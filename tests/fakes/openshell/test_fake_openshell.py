"""fake-openshell driven by the stubs in OpenShell's own published Python
package (`openshell` 0.1.2, unmodified), over mutual TLS: create, wait
until ready, exec (server streaming and interactive), config and delete
all decode on both sides, so the fake's message tables match what
OpenShell publishes (the policy hash has its own file,
test_policy_hash.py). What the gateway documents doing with what a
client sends is checked too: the main process an omitted command becomes,
a given one kept as sent, a main process's end making the sandbox
terminal, execs through bash in the workspace root, paging, the
container's network following the stored policy."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2
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
from policy_hash import policy_hash  # noqa: E402

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


def wait_phase(stub, name: str, want: int, seconds: float = 20):
    for _ in range(int(seconds / 0.05)):
        got = stub.GetSandbox(pb.GetSandboxRequest(workspace_scope=WS, name=name), timeout=10)
        if got.sandbox.status.phase == want:
            return got.sandbox
        time.sleep(0.05)
    raise AssertionError(f"{name} never reached phase {want}: {got.sandbox.status}")


def create(stub, name: str, **spec_fields) -> pb.Sandbox:
    spec_fields.setdefault("template", pb.SandboxTemplate(image="node:22"))
    spec_fields.setdefault("policy", policy())
    spec = pb.SandboxSpec(**spec_fields)
    return stub.CreateSandbox(pb.CreateSandboxRequest(workspace_scope=WS, name=name, spec=spec),
                              timeout=30).sandbox


def delete(stub, name: str) -> None:
    stub.DeleteSandbox(pb.DeleteSandboxRequest(workspace_scope=WS, name=name,
                                               allow_missing=True), timeout=30)


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
        assert not got.sandbox.status.HasField("exit_code")
        # No command was sent: the gateway stores its login shell on a
        # terminal, and that is what reads back; the rest as sent.
        stored = pb.SandboxSpec()
        stored.CopyFrom(spec)
        stored.command[:] = ["/bin/bash", "-l"]
        stored.tty = True
        assert got.sandbox.spec == stored and got.sandbox.metadata.labels["plimsoll.run"] == "1"
        assert made.sandbox.spec == stored
        config = stub.GetSandboxConfig(sb.GetSandboxConfigRequest(workspace_scope=WS,
                                                                  name="stub-test"), timeout=10)
        assert config.policy == policy()
        assert config.policy_source == sb.POLICY_SOURCE_SANDBOX
        assert config.configuration_admitted
        assert config.settings["agent_policy_proposals_enabled"].value.bool_value is False
        # The hash the fake states is OpenShell's identity of the policy
        # as these stubs serialize it (deterministically).
        raw = policy().SerializeToString(deterministic=True)
        assert config.policy_hash == policy_hash(messages.decode(messages.SandboxPolicy, raw))
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
        spec = pb.SandboxSpec(template=pb.SandboxTemplate(image="node:22"), policy=policy())
        for request, code in [
            (pb.CreateSandboxRequest(workspace_scope=WS), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.CreateSandboxRequest(workspace_scope=WS, name="no-spec"),
             grpc.StatusCode.INVALID_ARGUMENT),
            (pb.CreateSandboxRequest(name="x", spec=spec), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.CreateSandboxRequest(workspace_scope=WS, name="a-name-far-too-long-x", spec=spec),
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


def test_a_given_main_process_and_its_tty_are_kept_and_run(fake, pki):
    with channel(fake, pki) as ch:
        stub = pbg.OpenShellStub(ch)
        asked = [("keep-plain", ["sleep", "infinity"], False),
                 ("keep-tty", ["/bin/sh", "-c", "printf 'a b'; exec sleep infinity"], True)]
        for name, command, tty in asked:
            create(stub, name, command=command, tty=tty)
        for name, command, tty in asked:
            got = wait_phase(stub, name, pb.SANDBOX_PHASE_READY)
            assert (list(got.spec.command), got.spec.tty) == (command, tty)
        # The main process is what the sandbox runs.
        events = list(stub.ExecSandbox(pb.ExecSandboxRequest(
            workspace_scope=WS, sandbox="keep-plain", command=["ps", "-eo", "args="],
            no_login_shell=True), timeout=30))
        out = b"".join(e.stdout.data for e in events if e.HasField("stdout")).decode()
        assert "sleep infinity" in out.splitlines(), out
        for name, _, _ in asked:
            delete(stub, name)
    assert fake.live() == []


def test_fields_the_fake_does_not_know_are_dropped_never_echoed(fake, pki):
    with channel(fake, pki) as ch:
        stub = pbg.OpenShellStub(ch)
        made = create(stub, "drop-unknown", command=["sleep", "infinity"],
                      provider_attachment_epoch="caller-chosen",
                      template=pb.SandboxTemplate(image="", agent_socket="/x.sock"))
        got = wait_phase(stub, "drop-unknown", pb.SANDBOX_PHASE_READY)
        # A gateway keeps what its own messages declare; the fake keeps
        # what its tables declare (README.md), and nothing else comes back.
        for spec in (made.spec, got.spec):
            assert spec.provider_attachment_epoch == ""
            assert spec.template.agent_socket == ""
            # An empty image is the gateway's default image.
            assert spec.template.image == fake.image
        delete(stub, "drop-unknown")


@pytest.mark.parametrize("command,phase,code", [
    (["true"], "COMPLETED", 0),
    (["sh", "-c", "exit 3"], "ERROR", 3),
])
def test_a_main_process_that_ends_makes_the_sandbox_terminal(fake, pki, command, phase, code):
    with channel(fake, pki) as ch:
        stub = pbg.OpenShellStub(ch)
        create(stub, "ends", command=command)
        got = wait_phase(stub, "ends", getattr(pb, f"SANDBOX_PHASE_{phase}"))
        assert got.status.HasField("exit_code") and got.status.exit_code == code
        listed = stub.ListSandboxes(pb.ListSandboxesRequest(workspace_scope=WS), timeout=10)
        assert [s.status.phase for s in listed.sandboxes
                if s.metadata.name == "ends"] == [got.status.phase]
        with pytest.raises(grpc.RpcError) as e:
            list(stub.ExecSandbox(pb.ExecSandboxRequest(
                workspace_scope=WS, sandbox="ends", command=["true"]), timeout=10))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        delete(stub, "ends")
    assert fake.live() == []


def test_knobs_swap_the_main_process_or_kill_it(fake, pki):
    with channel(fake, pki) as ch:
        stub = pbg.OpenShellStub(ch)
        fake.set_fault("main_process_swapped")
        create(stub, "swapped", command=["sleep", "infinity"])
        got = wait_phase(stub, "swapped", pb.SANDBOX_PHASE_READY)
        assert (list(got.spec.command), got.spec.tty) == (["/bin/bash", "-l"], True)
        fake.set_fault("main_process_killed")
        create(stub, "killed", command=["sleep", "infinity"])
        got = wait_phase(stub, "killed", pb.SANDBOX_PHASE_ERROR)
        assert got.status.exit_code == 137
        assert list(got.spec.command) == ["sleep", "infinity"]
        for name in ("swapped", "killed"):
            delete(stub, name)
    assert fake.live() == []


def test_an_exec_runs_through_bash_in_the_workspace_root(fake, pki):
    with channel(fake, pki) as ch:
        stub = pbg.OpenShellStub(ch)
        create(stub, "shells", command=["sleep", "infinity"])
        wait_phase(stub, "shells", pb.SANDBOX_PHASE_READY)

        def run(command, **kw):
            events = list(stub.ExecSandbox(pb.ExecSandboxRequest(
                workspace_scope=WS, sandbox="shells", command=command, **kw), timeout=30))
            out = b"".join(e.stdout.data for e in events if e.HasField("stdout")).decode()
            return out, events[-1].exit.exit_code

        # The argv is quoted, never expanded; the directory is the
        # workspace root unless one is given.
        assert run(["sh", "-c", 'echo "$0" "$(pwd)"', "$HOME"]) == ("$HOME /sandbox\n", 0)
        assert run(["pwd"], workdir="/tmp") == ("/tmp\n", 0)
        assert run(["true"], workdir="/nowhere")[1] != 0
        # A login shell reads the profile (Debian's sets a PATH with the
        # games directories); `no_login_shell` skips it.
        assert "/usr/games" in run(["printenv", "PATH"])[0]
        assert "/usr/games" not in run(["printenv", "PATH"], no_login_shell=True)[0]
        assert run(["printenv", "ANSWER"], environment={"ANSWER": "forty two"}) == \
            ("forty two\n", 0)
        # The request's own timeout: the gateway reports 124.
        started = time.monotonic()
        out = run(["sleep", "30"], execution_timeout=duration_pb2.Duration(seconds=1))
        assert out[1] == 124 and time.monotonic() - started < 10
        delete(stub, "shells")
    assert fake.live() == []


def test_list_pages_as_documented(fake, pki):
    labels = {"paging": "1"}
    names = [fake.plant(labels) for _ in range(3)]
    try:
        with channel(fake, pki) as ch:
            stub = pbg.OpenShellStub(ch)
            seen, token = [], ""
            while True:
                page = stub.ListSandboxes(pb.ListSandboxesRequest(
                    workspace_scope=WS, page_size=2, page_token=token,
                    label_selector="paging=1"), timeout=10)
                seen += [s.metadata.name for s in page.sandboxes]
                token = page.next_page_token
                if not token:
                    break
                # The token belongs to this selector, not another.
                with pytest.raises(grpc.RpcError) as e:
                    stub.ListSandboxes(pb.ListSandboxesRequest(
                        workspace_scope=WS, page_token=token, label_selector="other=1"),
                        timeout=10)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert sorted(seen) == sorted(names)
            with pytest.raises(grpc.RpcError) as e:
                stub.ListSandboxes(pb.ListSandboxesRequest(workspace_scope=WS, page_size=-1),
                                   timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        for name in names:
            fake._remove(fake.sandboxes[name])


def network_of(fake, stub, name: str) -> "tuple[str, list[str]]":
    """(docker's network mode of the sandbox's container, the interfaces the
    sandbox itself lists)."""
    mode = subprocess.run(["docker", "inspect", "-f", "{{.HostConfig.NetworkMode}}",
                           fake.sandboxes[name].container],
                          capture_output=True, text=True, check=True).stdout.strip()
    events = list(stub.ExecSandbox(pb.ExecSandboxRequest(
        workspace_scope=WS, sandbox=name, command=["ls", "/sys/class/net"],
        no_login_shell=True), timeout=30))
    out = b"".join(e.stdout.data for e in events if e.HasField("stdout")).decode()
    return mode, out.split()


def with_network_rule() -> sb.SandboxPolicy:
    p = policy()
    rule = p.network_policies["pypi"]
    rule.name = "pypi"
    rule.endpoints.add(host="pypi.org", port=443)
    return p


@pytest.mark.parametrize("asked, network", [
    (policy, "none"),             # no network_policies entry: every connection out denied
    (with_network_rule, "jail"),  # one entry: its endpoint only (test_fake_openshell_jail.py)
    (None, "bridge"),             # no policy at all: the image's own may allow endpoints
])
def test_the_network_follows_the_stored_policy(fake, pki, asked, network):
    with channel(fake, pki) as ch:
        stub = pbg.OpenShellStub(ch)
        spec = pb.SandboxSpec(template=pb.SandboxTemplate(image="node:22"),
                              command=["sleep", "infinity"])
        if asked is not None:
            spec.policy.CopyFrom(asked())
        stub.CreateSandbox(pb.CreateSandboxRequest(workspace_scope=WS, name="net", spec=spec),
                           timeout=30)
        got = wait_phase(stub, "net", pb.SANDBOX_PHASE_READY)
        assert got.spec.HasField("policy") == (asked is not None)
        mode, interfaces = network_of(fake, stub, "net")
        if network == "jail":  # a network of its own
            assert mode == fake.state()["jails"]["net"]["network"]
        else:
            assert mode == network
        assert interfaces == (["lo"] if network == "none" else ["eth0", "lo"])
        delete(stub, "net")
    assert fake.live() == []


def test_egress_open_opens_a_sandbox_whose_policy_denies(fake, pki):
    with channel(fake, pki) as ch:
        stub = pbg.OpenShellStub(ch)
        fake.set_fault("egress_open")
        create(stub, "lie", command=["sleep", "infinity"])
        wait_phase(stub, "lie", pb.SANDBOX_PHASE_READY)
        # The policy still reads back without a network entry.
        config = stub.GetSandboxConfig(sb.GetSandboxConfigRequest(workspace_scope=WS,
                                                                  name="lie"), timeout=10)
        assert config.policy == policy() and not config.policy.network_policies
        assert network_of(fake, stub, "lie")[0] == "bridge"
        # The knob was for one create only.
        create(stub, "after", command=["sleep", "infinity"])
        wait_phase(stub, "after", pb.SANDBOX_PHASE_READY)
        assert network_of(fake, stub, "after") == ("none", ["lo"])
        for name in ("lie", "after"):
            delete(stub, name)
    assert fake.live() == []
