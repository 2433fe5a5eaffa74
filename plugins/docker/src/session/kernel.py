# The Python cell kernel of a session (python3 -I -u -c, started by the
# session agent, cwd /work). It is a process of its own so that a cell that
# never returns costs the kernel, not the agent: the agent kills it at the
# budget and starts a fresh one for the next cell.
#
# Protocol, agent side in agent.js: one JSON request per line on fd 3,
# {"nonce","begin","end","code"}. For each, the kernel writes `begin` to
# stdout and stderr, runs the code, flushes, writes `end` to both, then
# {"nonce","exit"} on fd 4; {"reap":true} asks it to collect children the
# agent's sweep killed. The agent keeps only what lies between the
# markers, so a thread that prints between cells is not charged to the next
# one. Every write is unbuffered (-u), so output written before a crash or
# os._exit reaches the agent.
#
# A cell runs in one persistent __main__ namespace, notebook-style: a final
# expression's value is printed with repr and kept as `_`, top-level await
# runs on one persistent event loop, and BaseException is caught so sys.exit()
# ends the cell, not the kernel. Tracebacks start at the cell's own frames.
import ast
import builtins
import json
import linecache
import os
import sys
import traceback
import types

FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
CO_COROUTINE = 0x80  # a code object that awaited at top level
CELL = "<cell-"


def put(fd, data):
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except OSError:
            return  # the agent is gone or the cell closed the fd


def flush():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass


def reap():
    # Children of earlier cells were killed by the agent's sweep; collect
    # them here (never from a signal handler, which would steal the status
    # a running cell's subprocess.run is waiting for).
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def say(text):
    try:
        sys.stderr.write(text)
    except BaseException:
        put(2, text.encode("utf-8", "replace"))


def show(exc):
    """The traceback from the first frame of a cell on: the kernel's own
    frames above it (exec, the event loop) are nobody's business."""
    tb = exc.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith(CELL):
        tb = tb.tb_next
    say("".join(traceback.format_exception(type(exc), exc, tb)))


class Kernel:
    def __init__(self):
        self.module = types.ModuleType("__main__")
        self.module.__builtins__ = builtins
        self.home = sys.modules["__main__"]  # the kernel's own globals live on
        sys.modules["__main__"] = self.module  # so pickle finds cell classes
        self.loop = None
        self.count = 0

    def drive(self, code):
        ns = self.module.__dict__
        if code.co_flags & CO_COROUTINE:
            if self.loop is None:
                import asyncio  # only for cells that await: it is slow to load

                self.loop = asyncio.new_event_loop()
                asyncio.set_event_loop(self.loop)
            return self.loop.run_until_complete(eval(code, ns))
        return eval(code, ns)

    def execute(self, src):
        """Runs one cell; returns its exit code (0 ran, 1 raised)."""
        self.count += 1
        name = f"{CELL}{self.count}>"
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        try:
            tree = ast.parse(src, name, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            body = compile(tree, name, "exec", FLAGS, dont_inherit=True)
            tail = compile(last, name, "eval", FLAGS, dont_inherit=True) if last else None
        except (SyntaxError, ValueError) as e:
            say("".join(traceback.format_exception_only(type(e), e)))
            return 1
        except BaseException as e:  # too deep to compile, say
            show(e)
            return 1
        try:
            self.drive(body)
            if tail is not None:
                value = self.drive(tail)
                if value is not None:
                    self.module.__dict__["_"] = value
                    print(repr(value))
        except SystemExit as e:
            if e.code is None or (isinstance(e.code, int) and e.code == 0):
                return 0
            if not isinstance(e.code, int):
                say(f"{e.code}\n")
            return 1
        except BaseException as e:
            show(e)
            return 1
        return 0

    def serve(self, requests):
        for line in requests:
            try:
                req = json.loads(line)
            except ValueError:
                continue
            reap()
            if "nonce" not in req:  # {"reap": true}: the agent swept
                continue
            begin, end = req["begin"].encode(), req["end"].encode()
            flush()  # what threads wrote before now belongs to no cell
            put(1, begin)
            put(2, begin)
            code = self.execute(req["code"])
            flush()
            put(1, end)
            put(2, end)
            put(4, json.dumps({"nonce": req["nonce"], "exit": code}).encode() + b"\n")


def main():
    requests = open(3, "rb")
    sys.argv = [""]
    # Like a script's directory: modules a cell's files put in /work import.
    sys.path.insert(0, "/work")
    Kernel().serve(requests)
    os._exit(0)  # the agent closed fd 3: the session is over


main()
