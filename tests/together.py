"""Start several processes in the same instant (the run-folder races of issue 53)."""
from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import Optional


def run_together(commands: list[list[str]], cwd: Optional[Path] = None, timeout: float = 600) -> list[tuple[int, str]]:
    """Run ``commands``, each a program that prints ``ready`` once set up and then waits for a line on stdin, so that
    their work starts together; returns each one's exit status and stderr."""
    procs = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=cwd) for command in commands]
    for p in procs:  # every one set up, none started (what they print before is theirs)
        for line in p.stdout:
            if line.strip() == "ready":
                break
        else:
            raise AssertionError(f"a process ended before it was ready: {p.wait()}, {p.stderr.read()[-2000:]}")
    start = threading.Barrier(len(procs))

    def go(proc: subprocess.Popen) -> None:
        start.wait()
        proc.stdin.write("\n")
        proc.stdin.flush()

    threads = [threading.Thread(target=go, args=(p,)) for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [(p.wait(timeout=timeout), p.stderr.read()) for p in procs]
