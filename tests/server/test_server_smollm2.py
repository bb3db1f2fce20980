"""The product command end to end: `python -m ignis.serve +model=smollm2-135m` in a
subprocess, the key from IGNIS_API_KEY, real answers from the embedded SmolLM2 through
the OpenAI SDK over HTTP and the socket, and its whole log output checked for the key
and the prompt text."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from server_harness import Frames, KEY

REPO = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of France?"
SYSTEM = ("You are a helpful assistant. You answer questions about geography in one short sentence, "
          "naming the place asked about and nothing else. You never add remarks, greetings or lists.")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_serve_smollm2_end_to_end():
    import openai

    port = _free_port()
    env = dict(os.environ, IGNIS_API_KEY=KEY)
    env.pop("TRITON_INTERPRET", None)  # the product runs the torch references on a CPU anyway
    proc = subprocess.Popen(
        [sys.executable, "-m", "ignis.serve", "+model=smollm2-135m", f"server.port={port}",
         "engine.num_kv_blocks=1024"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.3)
        c = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=120)
        r = c.responses.create(model="smollm2-135m", input=QUESTION, max_output_tokens=24, temperature=0)
        assert "Paris" in r.output_text
        cc = c.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": QUESTION}],
                                       max_tokens=24, temperature=0)
        assert cc.choices[0].message.content == r.output_text  # same prompt tokens, same greedy answer
        assert cc.usage.prompt_tokens == r.usage.input_tokens
        with c.responses.connect(websocket_connection_options={"compression": "deflate"}) as conn:  # as Codex
            assert "permessage-deflate" in conn._connection.response.headers["Sec-WebSocket-Extensions"]
            f = Frames(conn)
            conn.response.create(model="smollm2-135m", generate=False,
                                 input=[{"role": "developer", "content": SYSTEM}])
            warm = f.terminal()[-1]["response"]
            conn.response.create(model="smollm2-135m", previous_response_id=warm["id"], input=QUESTION,
                                 max_output_tokens=24, temperature=0)
            turn = f.terminal()[-1]["response"]
            assert turn["status"] == "completed" and "Paris" in turn["output"][0]["content"][0]["text"]
            assert turn["usage"]["input_tokens_details"]["cached_tokens"] > 0
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base + "/v1", api_key="sk-wrong", max_retries=0).models.list()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert "ignis.access" in out and "socket open" in out
    assert KEY not in out
    assert QUESTION not in out
