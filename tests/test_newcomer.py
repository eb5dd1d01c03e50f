"""A newcomer's first hour, scripted: after the README's install, the commands a first user
runs on the bundled pair, each as its own process, end to end: ``dspark --version``, ``dspark
demo`` (native target, no torch needed), ``dspark generate`` with a prompt, and ``dspark
serve`` answered by a chat request, then stopped with SIGTERM. Each must succeed and say what
a user reads: the speed-up line, the generated text, an assistant message."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dspark.bundled import bundled_dir

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
]

BUNDLE = bundled_dir()


def dspark(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m dspark ARGS`` as a user runs it (stdout and stderr captured)."""
    return subprocess.run(
        [sys.executable, "-m", "dspark", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_first_commands_a_newcomer_runs() -> None:
    version = dspark("--version")
    assert version.returncode == 0 and version.stdout.startswith("dspark "), version

    demo = dspark("demo", "--prompts", "2", "--max-new-tokens", "24", "--threads", "2", "--json")
    assert demo.returncode == 0, demo.stderr
    report = json.loads(demo.stdout.strip().splitlines()[-1])
    assert report["greedy_matches_target"] is True, report
    assert report["speedup_vs_target_only"] > 0, report
    # The default (scheduled) takes plain target steps where this machine's timings say drafting
    # would not pay, so its τ depends on the machine; the whole block's does not.
    assert report["acceptance_length"] >= 1.0 and report["plain_rounds"] <= report["rounds"]
    full = dspark("demo", "--prompts", "2", "--max-new-tokens", "24", "--verify", "full", "--json")
    assert full.returncode == 0, full.stderr
    report = json.loads(full.stdout.strip().splitlines()[-1])
    assert report["plain_rounds"] == 0 and report["acceptance_length"] > 1.5, report

    gen = dspark(
        "generate",
        "--target", str(BUNDLE / "target"),
        "--drafter", str(BUNDLE / "drafter"),
        "--prompt", "def fibonacci(n):\n",
        "--max-new-tokens", "16",
        "--json",
    )  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    out = json.loads(gen.stdout.strip().splitlines()[-1])
    assert out["text"] and len(out["tokens"]) <= 16

    from test_serve import Server

    server = Server()
    try:
        code, body = server.post(
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "Write a function that adds two ints."}],
                "max_tokens": 16,
                "temperature": 0,
            },
        )
        assert code == 200, body
        reply = json.loads(body)
        message = reply["choices"][0]["message"]
        assert message["role"] == "assistant" and isinstance(message["content"], str)
        assert reply["usage"]["completion_tokens"] <= 16
    finally:
        assert server.stop() == 0, "".join(server.log)
