"""The workload corpus (tests/workloads/corpus.toml) on docker under runc
(container tier) and runsc (kernel tier), and its snippets on wasm (process
tier), through the published client: runs, projects, and in a session its
projects, the Workspace and cells. The cloud adapters run it from their own
test modules, against their fakes. See workloads.py for how, and
docs/workloads.md for the tables these tests hold true."""

from __future__ import annotations

import os

import pytest

import workloads
from test_published_client import Daemon

IMAGE = os.environ.get("SANDBOX_DOCKER_IMAGE", "plimsoll/sandbox:bookworm")


@pytest.mark.parametrize("runtime,tier", [("runc", "container"), ("runsc", "kernel")])
def test_the_corpus_on_docker(runtime, tier):
    d = Daemon({"SANDBOX_PROVIDER": "docker", "SANDBOX_DOCKER_RUNTIME": runtime,
                "SANDBOX_DOCKER_IMAGE": IMAGE, "SANDBOX_MAX_SESSIONS": "2",
                "SANDBOX_SESSION_POOL": "1"})
    try:
        workloads.prove(runtime, d.url, minimum_isolation=tier)
    finally:
        d.stop()


def test_the_corpus_snippets_on_wasm():
    d = Daemon({"SANDBOX_PROVIDER": "wasm", "SANDBOX_MAX_SESSIONS": "2"})
    try:
        workloads.prove("wasm", d.url, minimum_isolation="process")
    finally:
        d.stop()
