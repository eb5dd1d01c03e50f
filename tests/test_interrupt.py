"""Ctrl-C stops a long generation: SIGINT to a process inside ``Speculator.generate`` (the
engine's loop running with the GIL released, no ``on_round`` hook) raises
``KeyboardInterrupt`` out of the call, and the speculator stays usable.

Each case runs in a child process on the bundled native pair. The child asks for far more
tokens than it could produce before its watchdog fires (``faulthandler`` ends it with exit
code 1 after ``WATCHDOG`` seconds), so a generation that ignores the signal fails the test
instead of passing late, and the child always stops by itself. No timing is asserted.

Each child starts with SIGINT at its default disposition (:func:`_sigint_default`): a test
run launched in the background (``cmd &`` in a non-interactive shell, as some CI runners do)
inherits SIGINT ignored, and Python then never installs its ``KeyboardInterrupt`` handler, as
for any program started that way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

#: Seconds after which a child that did not answer SIGINT ends itself (a failure).
WATCHDOG = 120

CHILD = textwrap.dedent(
    """
    import faulthandler, sys
    import dspark
    from dspark.bundled import bundled_dir

    faulthandler.dump_traceback_later({watchdog}, exit=True)
    root = bundled_dir()
    target = dspark.NativeTarget.from_pretrained(root / "target")
    drafter = dspark.Drafter.from_pretrained(root / "drafter", target, sts=False)
    spec = dspark.Speculator(target, drafter, temperature={temperature}, seed=5)
    call = getattr(spec, "{method}")
    call([[1, 2, 3]], 2)  # warm
    try:
        print("ready", flush=True)
        call([[1, 2, 3]], 1_000_000)
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    # Still usable: the same call as a fresh speculator's.
    again = call([[4, 5, 6]], 6).tokens
    fresh = dspark.Speculator(target, drafter, temperature={temperature}, seed=5)
    assert again == getattr(fresh, "{method}")([[4, 5, 6]], 6).tokens, again
    faulthandler.cancel_dump_traceback_later()
    print("usable", flush=True)
    """
)


def _sigint_default() -> None:
    """In the child before it runs Python: SIGINT back to its default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("method", "temperature"),
    [("generate", 0.0), ("generate", 0.8), ("generate_target_only", 0.0)],
)
def test_sigint_stops_a_long_generation(method: str, temperature: float) -> None:
    code = CHILD.format(watchdog=WATCHDOG, method=method, temperature=temperature)
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_default,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "ready", line + child.stderr.read() if child.stderr else line
        # Give the child time to enter the long call (not an assertion: a signal that lands
        # before the call is caught the same way). It must end that call, not wait for a
        # million tokens.
        time.sleep(0.5)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=WATCHDOG + 60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, out + err
    assert out.split() == ["interrupted", "usable"], out + err


def test_sigint_ends_calibrate_with_exit_130_and_no_file(tmp_path: Path) -> None:
    """``dspark calibrate`` asked for far more rounds than it could run: SIGINT once it is
    collecting ends it with exit code 130, one error line of its own, and no ``sts.json`` (nor
    a partial one) in the output folder."""
    from dspark.bundled import bundled_dir

    root = bundled_dir()
    out = tmp_path / "sts.json"
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dspark",
            "calibrate",
            "--target",
            str(root / "target"),
            "--drafter",
            str(root / "drafter"),
            "--rounds",
            "1000000",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_sigint_default,
    )
    try:
        assert child.stderr is not None
        seen = b""
        while b"collecting" not in seen:
            chunk = os.read(child.stderr.fileno(), 4096)
            assert chunk, seen.decode(errors="replace")  # it ended before collecting
            seen += chunk
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=WATCHDOG)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    text = (seen + err).decode(errors="replace")
    assert child.returncode == 130, text
    assert text.rstrip().splitlines()[-1] == "dspark: error [interrupted]: interrupted", text
    assert list(tmp_path.iterdir()) == []
