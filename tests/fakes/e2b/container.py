"""The docker side: one container per sandbox, and everything envd does
inside it, done with `docker exec`.

A sandbox is `docker run -d --rm --init --network <none|bridge> <image> sleep
infinity` labelled with the fake instance's ID, so a crashed fake's
containers can be found and removed by label. `--init` reaps orphans, so a
killed command's children do not linger as zombies. Each fake picks the
network from what the create asked for (`none`: only `lo`, which is what
makes "egress denied" true rather than claimed; `bridge`: docker's default
network, the way out; or a jail's own network, jail.py, with the names it
lets out written into /etc/hosts).
A caller that names the sandbox's own main process (fake-openshell) gets
that process in place of `sleep infinity`, and a container that stays once
it ends, so how it ended can be read.
"""

from __future__ import annotations

import os
import posixpath
import subprocess

LABEL = "io.plimsoll.fake-e2b"
DEFAULT_USER = "user"  # E2B's default user; the fake creates it in each container
DEFAULT_UID = 1000
USERS = {"root": "/root", "user": "/home/user"}  # who envd can act as, and their homes


class ContainerError(Exception):
    """A docker exec that failed: `kind` says how, for the caller to map."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


# Exit codes the small in-container scripts below use to say what went wrong.
_NOT_FOUND, _IS_DIR, _NOT_DIR, _EXISTS = 44, 45, 46, 47
_KINDS = {_NOT_FOUND: "not_found", _IS_DIR: "is_dir", _NOT_DIR: "not_dir", _EXISTS: "exists"}

# One EntryInfo per record: path, type (following links), size, octal mode,
# symbolic permissions, owner, group, mtime, link target; NUL-separated.
_FIND_FORMAT = r"%p\0%Y\0%s\0%m\0%M\0%u\0%g\0%T@\0%l\0"
_FIELDS_PER_ENTRY = 9


class Docker:
    def __init__(self, instance_id: str, docker: str = "docker") -> None:
        self.instance_id, self.docker = instance_id, docker

    def _run(self, args: "list[str]", *, input: "bytes | None" = None,
             timeout: "float | None" = 60) -> subprocess.CompletedProcess:
        return subprocess.run([self.docker, *args], input=input, capture_output=True,
                              timeout=timeout, check=False)

    # ---- container lifecycle -------------------------------------------------

    def create(self, image: str, sandbox_id: str, *, network: str,
               env: "dict[str, str]", container_signs: bool = False,
               main: "list[str] | None" = None, tty: bool = False,
               hosts: "list[tuple[str, str]] | None" = None) -> str:
        """A prepared container; its ID.

        By default its main process is `sleep infinity` and docker removes
        it when it stops. With `main` (an argv), that argv is the main
        process instead, run as the default user's uid with its stdin held
        open (nothing writes to it, nothing closes it) and, with `tty`, on a
        pseudo-terminal: the container ends when it ends. Such a container
        is kept once it ends, so `wait` can say how it ended; `remove` takes
        it away. A main process that ends before the container is prepared
        is not an error here: the container is returned, ended. `hosts`
        are (name, address) pairs for the container's /etc/hosts."""
        args = ["run", "-d"] + (["--rm"] if main is None else []) + [
            "--init", "--network", network,
            "--label", f"{LABEL}={self.instance_id}",
            "--label", f"{LABEL}.sandbox={sandbox_id}"]
        for name, address in hosts or []:
            args += ["--add-host", f"{name}:{address}"]
        for key, value in env.items():
            args += ["-e", f"{key}={value}"]
        if main is not None:
            args += ["-i", "-u", f"{DEFAULT_UID}:{DEFAULT_UID}"] + (["-t"] if tty else [])
        done = self._run(args + [image, *(main if main is not None else ["sleep", "infinity"])])
        if done.returncode != 0:
            if main is not None:
                # A main process that cannot start leaves a created container.
                self._remove_labelled(f"{LABEL}.sandbox={sandbox_id}")
            raise ContainerError("docker", done.stderr.decode(errors="replace").strip())
        container = done.stdout.decode().strip()
        # E2B runs commands as "user" (home /home/user) unless told otherwise.
        # A microVM shows no container runtime's marker file: docker's is
        # removed so the sandbox looks like the VM the fake stands in for
        # (this host's own CPU flags show a hypervisor truthfully). The
        # create_container_signs fault keeps it, for tests that need a
        # sandbox that is plainly a container.
        prepare = f"/usr/sbin/useradd -m -u {DEFAULT_UID} -s /bin/bash {DEFAULT_USER}"
        if not container_signs:
            prepare += " && rm -f /.dockerenv"
        done = self._run(["exec", "-u", "root", container, "/bin/sh", "-c", prepare])
        if done.returncode != 0:
            if main is not None and not self.running(container):
                return container
            self.remove(container)
            raise ContainerError("docker", "cannot prepare the sandbox: "
                                 + done.stderr.decode(errors="replace").strip())
        return container

    def remove(self, container: str) -> None:
        self._run(["rm", "-f", container])

    def join_network(self, container: str, network: str) -> None:
        """Moves a running container onto `network`. One made with `--network
        none` must leave `none` first: docker refuses to add a network to it."""
        self._run(["network", "disconnect", "none", container])
        done = self._run(["network", "connect", network, container])
        if done.returncode != 0:
            raise ContainerError("docker", done.stderr.decode(errors="replace").strip())

    def leave_network(self, container: str, network: str) -> None:
        self._run(["network", "disconnect", "-f", network, container])

    def add_hosts(self, container: str, hosts: "list[tuple[str, str]]") -> None:
        """Appends (name, address) lines to the container's /etc/hosts, as
        root, for names it does not list yet (what `--add-host` does at
        create, for a running container). Names are checked by the caller:
        they go into a shell script only as arguments."""
        listed = """awk -v n="$2" '{for (i = 2; i <= NF; i++) if ($i == n) f = 1} END {exit !f}'"""
        script = (f'while [ $# -gt 1 ]; do {listed} /etc/hosts '
                  '|| printf "%s\\t%s\\n" "$1" "$2" >> /etc/hosts; shift 2; done')
        pairs = [word for name, address in hosts for word in (address, name)]
        self._script(container, "root", script, *pairs)

    def remove_all(self) -> "list[str]":
        """Every container this fake instance made (by label), removed."""
        return self._remove_labelled(f"{LABEL}={self.instance_id}")

    def _remove_labelled(self, label: str) -> "list[str]":
        done = self._run(["ps", "-aq", "--filter", f"label={label}"])
        ids = done.stdout.decode().split()
        if ids:
            self._run(["rm", "-f", *ids])
        return ids

    def running(self, container: str) -> bool:
        done = self._run(["ps", "-q", "--no-trunc", "--filter", f"id={container}"])
        return container in done.stdout.decode()

    def wait(self, container: str) -> "int | None":
        """Blocks until the container's main process has ended; its exit
        status as docker states it (128 + n after signal n), or None when
        docker cannot say (the container is gone)."""
        try:
            done = self._run(["wait", container], timeout=None)
        except OSError:
            return None
        out = done.stdout.decode().strip()
        return int(out) if done.returncode == 0 and out.isdigit() else None

    def kill(self, container: str) -> None:
        """SIGKILL to the container's main process (by way of its init)."""
        self._run(["kill", "--signal", "KILL", container], timeout=30)

    # ---- processes ------------------------------------------------------------

    def exec_argv(self, container: str, argv: "list[str]", *, user: str,
                  cwd: "str | None" = None, env: "dict[str, str] | None" = None,
                  stdin: bool = False) -> "list[str]":
        args = [self.docker, "exec"] + (["-i"] if stdin else []) + ["-u", user]
        if cwd:
            args += ["-w", cwd]
        for key, value in (env or {}).items():
            args += ["-e", f"{key}={value}"]
        return args + [container, *argv]

    def spawn(self, container: str, cmd: str, args: "list[str]", *, user: str, cwd: str,
              env: "dict[str, str]", stdin: bool) -> subprocess.Popen:
        """Start a command; its first stdout line is its PID in the container.

        The wrapper prints its own PID and execs the command, so the PID is the
        command's; docker exec makes it a session and group leader, so a signal
        to the group reaches its children too."""
        wrapper = ["/bin/sh", "-c", 'echo $$; exec "$@"', "fake-e2b", cmd, *args]
        return subprocess.Popen(
            self.exec_argv(container, wrapper, user=user, cwd=cwd, env=env, stdin=stdin),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)

    def signal(self, container: str, pid: int, signum: int) -> None:
        # dash's kill takes a negative PID for the group, but not "--".
        script = f"kill -{signum} -{pid} 2>/dev/null || kill -{signum} {pid}"
        self._run(["exec", "-u", "root", container, "/bin/sh", "-c", script], timeout=30)

    # ---- files ------------------------------------------------------------------

    def _script(self, container: str, user: str, script: str, *paths: str,
                input: "bytes | None" = None, timeout: "float | None" = 60) -> bytes:
        argv = ["exec"] + (["-i"] if input is not None else []) + ["-u", user, container,
                                                                   "/bin/sh", "-c", script,
                                                                   "fake-e2b", *paths]
        try:
            done = self._run(argv, input=input, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ContainerError("timeout", "the operation did not finish in time")
        if done.returncode == 0:
            return done.stdout
        message = done.stderr.decode(errors="replace").strip()
        raise ContainerError(_KINDS.get(done.returncode, "failed"), message or
                             f"exit status {done.returncode}")

    def read_file(self, container: str, user: str, path: str) -> bytes:
        return self._script(container, user,
                            f'[ -e "$1" ] || exit {_NOT_FOUND}; [ -d "$1" ] && exit {_IS_DIR}; '
                            'exec cat -- "$1"', path)

    def write_file(self, container: str, user: str, path: str, data: bytes) -> None:
        self._script(container, user,
                     f'[ -d "$1" ] && exit {_IS_DIR}; mkdir -p -- "$(dirname -- "$1")" '
                     '&& cat > "$1"', path, input=data)

    def stat(self, container: str, user: str, path: str) -> dict:
        out = self._script(container, user,
                           f'[ -e "$1" ] || [ -L "$1" ] || exit {_NOT_FOUND}; '
                           f"exec find \"$1\" -maxdepth 0 -printf '{_FIND_FORMAT}'", path)
        return _entries(out)[0]

    def list_dir(self, container: str, user: str, path: str, depth: int) -> "list[dict]":
        out = self._script(container, user,
                           f'[ -e "$1" ] || exit {_NOT_FOUND}; [ -d "$1" ] || exit {_NOT_DIR}; '
                           f"exec find \"$1\" -mindepth 1 -maxdepth {int(depth)} "
                           f"-printf '{_FIND_FORMAT}'", path)
        return sorted(_entries(out), key=lambda entry: entry["path"])

    def make_dir(self, container: str, user: str, path: str) -> None:
        self._script(container, user, f'[ -e "$1" ] && exit {_EXISTS}; exec mkdir -p -- "$1"',
                     path)

    def remove_path(self, container: str, user: str, path: str) -> None:
        self._script(container, user,
                     f'[ -e "$1" ] || [ -L "$1" ] || exit {_NOT_FOUND}; exec rm -rf -- "$1"', path)

    def move(self, container: str, user: str, source: str, destination: str) -> None:
        self._script(container, user,
                     f'[ -e "$1" ] || [ -L "$1" ] || exit {_NOT_FOUND}; '
                     'mkdir -p -- "$(dirname -- "$2")" && exec mv -- "$1" "$2"',
                     source, destination)


def resolve_path(path: str, user: str) -> str:
    """envd takes paths relative to the user's home directory."""
    if not path:
        path = "."
    if path == "~" or path.startswith("~/"):
        path = path[2:] if path != "~" else "."
    joined = path if path.startswith("/") else posixpath.join(USERS[user], path)
    return posixpath.normpath(joined).replace("//", "/")


def _entries(out: bytes) -> "list[dict]":
    parts = out.split(b"\0")[:-1]
    entries = []
    for i in range(0, len(parts) - _FIELDS_PER_ENTRY + 1, _FIELDS_PER_ENTRY):
        path, kind, size, mode, perms, owner, group, mtime, target = (
            p.decode("utf-8", "replace") for p in parts[i:i + _FIELDS_PER_ENTRY])
        entry = {
            "name": posixpath.basename(path) or path,
            "type": 2 if kind == "d" else 1,  # FILE_TYPE_DIRECTORY / FILE_TYPE_FILE
            "path": path, "size": int(size), "mode": int(mode, 8), "permissions": perms,
            "owner": owner, "group": group, "modified_time": float(mtime),
        }
        if target:
            entry["symlink_target"] = target
        entries.append(entry)
    return entries


def docker_available(docker: str = "docker") -> bool:
    try:
        return subprocess.run([docker, "info", "--format", "{{.ID}}"], capture_output=True,
                              timeout=20, env={**os.environ}).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
