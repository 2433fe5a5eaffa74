"""envd's messages, as tables for protowire: field numbers, names and types
from E2B's published spec (spec/envd/process/process.proto and
spec/envd/filesystem/filesystem.proto). Only what the fake serves is here.

Oneof members are plain fields with presence: which one is set is which key
the dict carries.
"""

from __future__ import annotations

from protowire import (
    BOOL, BYTES, ENUM, INT64, MAP_SS, MESSAGE, SINT32, STRING, TIMESTAMP, UINT32,
    Field as F, Message as M, enum_type,
)

# ---- process ---------------------------------------------------------------

SIGNAL = enum_type({"SIGNAL_UNSPECIFIED": 0, "SIGNAL_SIGTERM": 15, "SIGNAL_SIGKILL": 9})

PtySize = M("process.PTY.Size", [F(1, "cols", UINT32), F(2, "rows", UINT32)])
Pty = M("process.PTY", [F(1, "size", MESSAGE, message=PtySize)])
ProcessConfig = M("process.ProcessConfig", [
    F(1, "cmd", STRING),
    F(2, "args", STRING, repeated=True),
    F(3, "envs", MAP_SS),
    F(4, "cwd", STRING, presence=True),
])
ProcessSelector = M("process.ProcessSelector", [  # oneof selector
    F(1, "pid", UINT32, presence=True),
    F(2, "tag", STRING, presence=True),
])
ProcessInput = M("process.ProcessInput", [  # oneof input
    F(1, "stdin", BYTES, presence=True),
    F(2, "pty", BYTES, presence=True),
])

StartEvent = M("process.ProcessEvent.StartEvent", [F(1, "pid", UINT32)])
DataEvent = M("process.ProcessEvent.DataEvent", [  # oneof output
    F(1, "stdout", BYTES, presence=True),
    F(2, "stderr", BYTES, presence=True),
    F(3, "pty", BYTES, presence=True),
])
EndEvent = M("process.ProcessEvent.EndEvent", [
    F(1, "exit_code", SINT32),
    F(2, "exited", BOOL),
    F(3, "status", STRING),
    F(4, "error", STRING, presence=True),
])
KeepAlive = M("process.ProcessEvent.KeepAlive", [])
ProcessEvent = M("process.ProcessEvent", [  # oneof event
    F(1, "start", MESSAGE, message=StartEvent),
    F(2, "data", MESSAGE, message=DataEvent),
    F(3, "end", MESSAGE, message=EndEvent),
    F(4, "keepalive", MESSAGE, message=KeepAlive),
])

StartRequest = M("process.StartRequest", [
    F(1, "process", MESSAGE, message=ProcessConfig),
    F(2, "pty", MESSAGE, message=Pty),
    F(3, "tag", STRING, presence=True),
    F(4, "stdin", BOOL, presence=True),
])
# StartResponse and ConnectResponse share one shape: {event: ProcessEvent}.
StartResponse = M("process.StartResponse", [F(1, "event", MESSAGE, message=ProcessEvent)])
ConnectResponse = M("process.ConnectResponse", [F(1, "event", MESSAGE, message=ProcessEvent)])
ConnectRequest = M("process.ConnectRequest", [F(1, "process", MESSAGE, message=ProcessSelector)])

ListRequest = M("process.ListRequest", [])
ProcessInfo = M("process.ProcessInfo", [
    F(1, "config", MESSAGE, message=ProcessConfig),
    F(2, "pid", UINT32),
    F(3, "tag", STRING, presence=True),
])
ListResponse = M("process.ListResponse", [F(1, "processes", MESSAGE, message=ProcessInfo,
                                            repeated=True)])

SendInputRequest = M("process.SendInputRequest", [
    F(1, "process", MESSAGE, message=ProcessSelector),
    F(2, "input", MESSAGE, message=ProcessInput),
])
StreamInputStart = M("process.StreamInputRequest.StartEvent",
                     [F(1, "process", MESSAGE, message=ProcessSelector)])
StreamInputData = M("process.StreamInputRequest.DataEvent",
                    [F(2, "input", MESSAGE, message=ProcessInput)])
StreamInputRequest = M("process.StreamInputRequest", [  # oneof event
    F(1, "start", MESSAGE, message=StreamInputStart),
    F(2, "data", MESSAGE, message=StreamInputData),
    F(3, "keepalive", MESSAGE, message=M("process.StreamInputRequest.KeepAlive", [])),
])
SendSignalRequest = M("process.SendSignalRequest", [
    F(1, "process", MESSAGE, message=ProcessSelector),
    F(2, "signal", ENUM, enum=SIGNAL),
])
CloseStdinRequest = M("process.CloseStdinRequest",
                      [F(1, "process", MESSAGE, message=ProcessSelector)])
Empty = M("Empty", [])  # every *Response the fake answers with no fields

# ---- filesystem --------------------------------------------------------------

FILE_TYPE = enum_type({"FILE_TYPE_UNSPECIFIED": 0, "FILE_TYPE_FILE": 1,
                       "FILE_TYPE_DIRECTORY": 2})
FILE_TYPE_FILE, FILE_TYPE_DIRECTORY = 1, 2

EntryInfo = M("filesystem.EntryInfo", [
    F(1, "name", STRING),
    F(2, "type", ENUM, enum=FILE_TYPE),
    F(3, "path", STRING),
    F(4, "size", INT64),
    F(5, "mode", UINT32),
    F(6, "permissions", STRING),
    F(7, "owner", STRING),
    F(8, "group", STRING),
    F(9, "modified_time", TIMESTAMP),
    F(10, "symlink_target", STRING, presence=True),
])
PathRequest = M("filesystem.PathRequest", [F(1, "path", STRING)])  # Stat/MakeDir/Remove
EntryResponse = M("filesystem.EntryResponse", [F(1, "entry", MESSAGE, message=EntryInfo)])
MoveRequest = M("filesystem.MoveRequest", [F(1, "source", STRING), F(2, "destination", STRING)])
ListDirRequest = M("filesystem.ListDirRequest", [F(1, "path", STRING), F(2, "depth", UINT32)])
ListDirResponse = M("filesystem.ListDirResponse",
                    [F(1, "entries", MESSAGE, message=EntryInfo, repeated=True)])

