"""A Python interpreter that has imported torch, transformers and hf_vit_plus once and forks a child for each program
it is asked to run, so that a test that runs many short programs does not pay those imports (seconds each) per
program. Run as `python tests/preloaded_python.py`; `PreloadedPython` below starts it and talks to it.

Each request is one JSON line on the server's stdin: `{"argv": [...], "cwd": ..., "stdout": ..., "stderr": ...}`,
with `argv` what would follow `python` on a command line (`["-c", code]`, `["-m", module, ...]` or
`[script, ...]`). The server forks; the child changes to `cwd`, sends its output to the two files and runs the
program as `python` would (`__main__`, `sys.argv`, `sys.orig_argv`, `sys.path[0]`); an exception ends it with
Python's own traceback and status 1, and it leaves through the interpreter's normal exit (threads joined, `atexit`
run). The server answers with two JSON lines: the child's pid when it starts, its exit status when it ends
(negative: the signal that ended it).

What differs from a fresh interpreter: the preloaded modules are already imported, so environment variables that
they read at import (HF_ENDPOINT, HF_HUB_OFFLINE, OMP_NUM_THREADS, ...) are the server's. A program that needs
others runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRELOADED = ("torch", "transformers", "hf_vit_plus")


def _child(request: dict) -> None:
    import builtins
    import runpy
    import types

    os.chdir(request["cwd"])
    written = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    targets = ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], written), (2, request["stderr"], written))
    for fd, name, flags in targets:
        opened = os.open(name, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    argv = request["argv"]
    sys.orig_argv = [sys.executable, *argv]  # the command line as a fresh interpreter would have got it
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        main = types.ModuleType("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    elif argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = str(Path(argv[0]).resolve().parent)
        runpy.run_path(argv[0], run_name="__main__")
    raise SystemExit(0)


def serve() -> None:
    for name in PRELOADED:
        __import__(name)
    answers = sys.stdout
    print(json.dumps({"ready": True}), file=answers, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)  # ends the child: it never comes back here
        print(json.dumps({"pid": pid}), file=answers, flush=True)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(json.dumps({"status": code}), file=answers, flush=True)


class PreloadedPython:
    """The server above, started with `env`; `run(argv, cwd, timeout)` runs one program and returns a
    `subprocess.CompletedProcess` as `subprocess.run(..., capture_output=True, text=True)` would."""

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        self.folder = Path(tempfile.mkdtemp(prefix="preloaded-python-"))  # the programs' output, outside their cwd
        self.process = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, text=True
        )
        self._pending = b""  # answers read from the pipe but not yet taken (both lines can come in one read)
        assert json.loads(self._answer(300)) == {"ready": True}

    def _answer(self, timeout: float) -> str:
        """The server's next line, read from the pipe's descriptor itself: a buffered reader could hold the second
        answer while `select` waits for more."""
        deadline = time.monotonic() + timeout
        fd = self.process.stdout.fileno()
        while b"\n" not in self._pending:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the preloaded interpreter ended (status {self.process.wait()})")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode()

    def run(self, argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        out, err = self.folder / "stdout", self.folder / "stderr"
        request = {"argv": argv, "cwd": str(cwd), "stdout": str(out), "stderr": str(err)}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        pid = json.loads(self._answer(60))["pid"]
        try:
            status = json.loads(self._answer(timeout))["status"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            self._answer(60)
            raise subprocess.TimeoutExpired(argv, timeout) from None
        output, errors = out.read_text(errors="replace"), err.read_text(errors="replace")
        result = subprocess.CompletedProcess(argv, status, output, errors)
        out.unlink()
        err.unlink()
        return result

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)
        shutil.rmtree(self.folder, ignore_errors=True)


if __name__ == "__main__":
    serve()
