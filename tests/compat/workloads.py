"""The workload corpus (tests/workloads/corpus.toml) through the published
client, on whatever a daemon offers: snippets and projects as single runs,
and in a session its projects, the client's Workspace and cells.

Each tier's test calls `prove(tier, url)`. It learns from Describe which
surfaces the daemon offers, runs every workload on each surface that can
carry it, judges every outcome against the corpus, and fails naming each
workload that did not do what the corpus says. Then it renders the tier's
table and holds docs/workloads.md to it: a table that differs from what was
just measured fails the test (`PLIMSOLL_WRITE_WORKLOADS=1` rewrites it).

Batching keeps this cheap: a project carries up to 20 workloads, one step
each. A step cannot fail the project (a failed step would stop the plan),
so each ends by printing the workload's exit status on stderr, after the
workload's own output; the workload itself runs unchanged, from a file, in
a directory of its own.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from plimsoll_client import Client
from plimsoll_client.workspace import Workspace

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "workloads" / "corpus.toml"
DOCS = ROOT / "docs" / "workloads.md"

#: Steps a project may carry (docs/api.md).
MAX_STEPS = 20
#: Each stream of a step or snippet is kept to this many bytes (docs/api.md).
STREAM_CAP = 64 * 1024
RUNNERS = {"shell": ("sh", "sh"), "python": ("python3", "py"), "node": ("node", "js")}
CELL_LANGUAGE = {"python": "python", "node": "javascript", "js": "javascript"}
RC = re.compile(rb"@@rc=(\d+)\n\Z")

#: The surfaces, in the table's column order.
SURFACES = ("run", "session project", "workspace", "cell")


@dataclass
class Workload:
    id: str
    kind: str
    what: str
    code: str
    files: dict[str, str] = field(default_factory=dict)
    stdin: Optional[str] = None
    cell: bool = True
    forbidden: bool = False
    expect: dict = field(default_factory=dict)
    on: list[dict] = field(default_factory=list)

    def expectation(self, tier: str) -> dict:
        want = dict(self.expect)
        for o in self.on:
            if tier in o.get("tiers", []):
                want.update({k: v for k, v in o.items() if k != "tiers"})
        return want

    @property
    def cellable(self) -> bool:
        return self.kind in CELL_LANGUAGE and self.cell and self.stdin is None


def load() -> list[Workload]:
    with CORPUS.open("rb") as f:
        data = tomllib.load(f)
    out = []
    for w in data["workload"]:
        out.append(Workload(id=w["id"], kind=w["kind"], what=w["what"], code=w["code"],
                            files=w.get("files", {}), stdin=w.get("stdin"),
                            cell=w.get("cell", True), forbidden=w.get("forbidden", False),
                            expect=w.get("expect", {}),
                            on=w.get("on", [])))
    ids = [w.id for w in out]
    assert len(ids) == len(set(ids)), "workload ids must be unique"
    for w in out:
        assert re.fullmatch(r"[a-z0-9-]{1,40}", w.id), w.id
        assert w.kind in ("shell", "python", "node", "js"), (w.id, w.kind)
    return out


@dataclass
class Outcome:
    stdout: bytes
    stderr: bytes
    exit: int
    stdout_truncated: bool = False


def judge(w: Workload, tier: str, out: Outcome) -> list[str]:
    """What about `out` is not what the corpus says `w` does on `tier`."""
    want = w.expectation(tier)
    bad = []
    exit_want = want.get("exit", 0)
    if exit_want == "nonzero":
        if out.exit == 0:
            bad.append("exited 0; it must fail")
    elif out.exit != exit_want:
        bad.append(f"exited {out.exit}, not {exit_want}")
    stdout = out.stdout.decode("utf-8", "replace")
    stderr = out.stderr.decode("utf-8", "replace")
    if "stdout_bytes" in want:
        # The program printed more than a stream carries: what came back is
        # the first 64 KiB, flagged.
        n = want["stdout_bytes"]
        keep = min(n, STREAM_CAP)
        if len(out.stdout) != keep or out.stdout_truncated != (n > STREAM_CAP):
            bad.append(f"stdout was {len(out.stdout)} bytes (truncated: {out.stdout_truncated}),"
                       f" not the first {keep} of {n}")
    if "stdout" in want and stdout != want["stdout"]:
        bad.append(f"stdout {stdout[:300]!r} is not {want['stdout'][:300]!r}")
    for s in want.get("stdout_has", []):
        if s not in stdout:
            bad.append(f"stdout lacks {s!r}")
    for r in want.get("stdout_re", []):
        if not re.search(r, stdout, re.MULTILINE):
            bad.append(f"stdout does not match {r!r}")
    for s in want.get("stderr_has", []):
        if s not in stderr:
            bad.append(f"stderr lacks {s!r}")
    for r in want.get("stderr_re", []):
        if not re.search(r, stderr, re.MULTILINE):
            bad.append(f"stderr does not match {r!r}")
    if bad:
        bad.append(f"(stdout {stdout[:400]!r}, stderr {stderr[:400]!r})")
    return bad


# ---- the surfaces ----


def batches(ws: list[Workload], top: str) -> list[tuple[dict[str, str], list[str], list[str]]]:
    """Projects carrying `ws` (not snippets), at most 20 a project: each
    workload's code, stdin and files under `top`, and one step for it."""
    runnable = [w for w in ws if w.kind in RUNNERS]
    out = []
    for i in range(0, len(runnable), MAX_STEPS):
        files: dict[str, str] = {}
        steps, ids = [], []
        for w in runnable[i:i + MAX_STEPS]:
            runner, ext = RUNNERS[w.kind]
            files[f"{top}/code/{w.id}.{ext}"] = w.code
            stdin = "/dev/null"
            if w.stdin is not None:
                files[f"{top}/stdin/{w.id}"] = w.stdin
                stdin = f"../../stdin/{w.id}"
            for path, content in w.files.items():
                files[f"{top}/w/{w.id}/{path}"] = content
            steps.append(f'mkdir -p {top}/w/{w.id} && cd {top}/w/{w.id} && '
                         f'{runner} ../../code/{w.id}.{ext} < {stdin}; echo "@@rc=$?" >&2')
            ids.append(w.id)
        out.append((files, steps, ids))
    return out


def run_projects(run_project: Callable, ws: list[Workload], top: str) -> dict[str, Outcome]:
    results: dict[str, Outcome] = {}
    for files, steps, ids in batches(ws, top):
        r = run_project(files, steps, timeout=120)
        assert r.outcome == "completed" and len(r.steps) == len(steps), (r.outcome, r.detail, ids)
        for wid, step in zip(ids, r.steps):
            m = RC.search(step.stderr)
            if m is None:
                # The status line was lost (stderr past its cap): judged as
                # a failure with what came back.
                results[wid] = Outcome(step.stdout, step.stderr, -1, step.stdout_truncated)
                continue
            results[wid] = Outcome(step.stdout, step.stderr[:m.start()], int(m.group(1)),
                                   step.stdout_truncated)
    return results


def run_snippets(client, ws: list[Workload]) -> dict[str, Outcome]:
    out = {}
    for w in ws:
        if w.kind == "js":
            r = client.run_javascript(w.code, timeout=30)
            out[w.id] = Outcome(r.stdout, r.stderr, r.exit_code, r.stdout_truncated)
    return out


def place(run_project: Callable, ws: list[Workload], top: str) -> None:
    """Each workload's files in a fresh `top/<id>/`, for the surfaces that
    take no files of their own."""
    files = {f"{top}/{w.id}/{p}": c for w in ws for p, c in w.files.items()}
    steps = [f"mkdir -p " + " ".join(f"{top}/{w.id}" for w in ws)]
    r = run_project(files, steps, timeout=60)
    assert r.outcome == "completed" and r.steps[0].exit_code == 0, (r.outcome, r.detail)


def run_workspace(session, ws: list[Workload]) -> dict[str, Outcome]:
    shell = [w for w in ws if w.kind == "shell" and w.stdin is None]
    if not shell:
        return {}
    space = Workspace(session, timeout=60)
    place(session.run_project, shell, "ws")
    out = {}
    for w in shell:
        # Each command starts in its own directory; the workload's text runs
        # as the client sends any command.
        r = space.exec(f"cd {space.root}/ws/{w.id}\n{w.code}")
        out[w.id] = Outcome(r.stdout, r.stderr, r.exit_code, r.stdout_truncated)
    return out


def run_cells(session, ws: list[Workload], languages: list[str], root: str) -> dict[str, Outcome]:
    """Python, node and snippet workloads as cells. Node workloads need
    node behind the javascript cells and their files placed, so they run
    only where the session also runs projects (`root` known)."""
    cells = [w for w in ws if w.cellable and CELL_LANGUAGE[w.kind] in languages
             and (w.kind == "js" or root)]
    if not cells:
        return {}
    with_files = [w for w in cells if w.kind != "js"]
    if with_files:
        place(session.run_project, with_files, "cells")
    out = {}
    for w in cells:
        here = f"{root}/cells/{w.id}"
        if w.kind == "python":
            code = f"import os as __os; __os.chdir({here!r})\n{w.code}"
        elif w.kind == "node":
            code = f"process.chdir({here!r});\n{w.code}"
        else:
            code = w.code
        r = session.run_cell(code, language=CELL_LANGUAGE[w.kind], timeout=30)
        out[w.id] = Outcome(r.stdout, r.stderr, r.exit_code, r.stdout_truncated)
    return out


# ---- one tier ----


def prove(tier: str, url: str, *, minimum_isolation: Optional[str] = None) -> None:
    """Runs the corpus on every surface the daemon at `url` offers, fails
    with every workload that did not do what the corpus says, and holds the
    tier's table in docs/workloads.md to what was measured."""
    ws = load()
    client = Client(url)
    info = client.describe()
    seen: dict[str, dict[str, Outcome]] = {}
    if info.javascript_environment is not None:
        seen["run"] = run_snippets(client, ws)
    if info.supports_project:
        seen.setdefault("run", {}).update(run_projects(client.run_project, ws, "runs"))
    if info.supports_sessions:
        languages = list(info.session_environment.languages) if info.session_environment else []
        with client.open_session(minimum_isolation=minimum_isolation,
                                 languages=[l for l in languages if l == "python"] or None) as s:
            if info.supports_project:
                seen["session project"] = run_projects(s.run_project, ws, "projects")
                seen["workspace"] = run_workspace(s, ws)
                root = Workspace(s, timeout=60).root
            else:
                root = ""
            seen["cell"] = run_cells(s, ws, languages, root)
    problems = []
    for surface, results in seen.items():
        for w in ws:
            if w.id in results:
                for why in judge(w, tier, results[w.id]):
                    problems.append(f"{tier} {surface} {w.id}: {why}")
    assert not problems, f"{len(problems)} workload problems:\n" + "\n".join(problems)
    hold_docs(tier, table(tier, ws, seen))


def table(tier: str, ws: list[Workload], seen: dict[str, dict[str, Outcome]]) -> str:
    cols = [s for s in SURFACES if s in seen]
    ran = sum(len(r) for r in seen.values())
    lines = [f"{sum(1 for w in ws if any(w.id in seen[c] for c in cols))} workloads, "
             f"{ran} runs of them, every one as the corpus says.", "",
             "| workload | kind | what | " + " | ".join(cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]
    notes = []
    for w in ws:
        if not any(w.id in seen[c] for c in cols):
            continue
        want = w.expectation(tier)
        if "note" in want:
            mark = "differs, see below"
            notes.append(f"- `{w.id}`: {want['note']}.")
        elif w.forbidden:
            mark = "allowed here" if want.get("exit", 0) == 0 else "refused as documented"
        else:
            mark = "ok"
        marks = [mark if w.id in seen[c] else "—" for c in cols]
        lines.append(f"| `{w.id}` | {w.kind} | {w.what} | " + " | ".join(marks) + " |")
    if notes:
        lines += ["", "Where this tier differs from what agents expect:", ""] + notes
    return "\n".join(lines) + "\n"


def hold_docs(tier: str, text: str) -> None:
    begin, end = f"<!-- workloads:{tier} -->\n", f"<!-- /workloads:{tier} -->"
    doc = DOCS.read_text()
    start, stop = doc.find(begin), doc.find(end)
    assert start >= 0 and stop > start, f"docs/workloads.md has no section for {tier}"
    have = doc[start + len(begin):stop]
    if have == text:
        return
    if os.environ.get("PLIMSOLL_WRITE_WORKLOADS") == "1":
        DOCS.write_text(doc[:start + len(begin)] + text + doc[stop:])
        return
    raise AssertionError(
        f"docs/workloads.md's {tier} table is not what was measured; rerun with "
        f"PLIMSOLL_WRITE_WORKLOADS=1 to write it. Measured:\n{text}")
