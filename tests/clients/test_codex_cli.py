"""Codex CLI 0.171, unmodified, against ignis: `codex exec` over HTTP and over the
socket with the scripted model (a full tool loop: Codex runs `echo hello`, sends the
output back, gets the final answer), `codex exec resume --last` on the socket, its
default tool set with the freeform `apply_patch` (the file on disk changes) and
`--output-schema`, the model catalog read from the server (GET /v1/models, no catalog
file) with `--sandbox workspace-write` letting the patch land, and a one-turn answer from
the real SmolLM2.

The server runs in this process, so the socket tests spy on what it received (each
frame, as decoded) and on each response's usage (conftest.spy), not on the wire."""

from __future__ import annotations

import json

import pytest

from tests.clients.codex import SMALL_MODEL_INSTRUCTIONS, codex_home, run_codex
from tests.server.server_harness import KEY, ServedProcess



def check_tool_loop(run) -> None:
    assert run.rc == 0, run.stderr[-2000:]
    [command] = run.items("command_execution")
    assert "echo hello" in command["command"]
    assert command["exit_code"] == 0 and command["aggregated_output"] == "hello\n"
    [answer] = run.items("agent_message")
    assert answer["text"] == "The command printed hello."
    assert run.events[-1]["type"] == "turn.completed"


def test_codex_tool_loop_over_http(scripted_server, tmp_path):
    home = codex_home(tmp_path / "home", scripted_server.base_url, websockets=False)
    run = run_codex(home, tmp_path / "work", "Please run echo hello", key=KEY)
    check_tool_loop(run)
    usage = run.events[-1]["usage"]
    # Two requests, the second resending the first's prompt plus under 200 tokens (the
    # call and its output): all the first prompt's full blocks come from the prefix cache.
    first_prompt_at_least = (usage["input_tokens"] - 200) // 2
    assert usage["cached_input_tokens"] >= first_prompt_at_least - 16
    assert usage["reasoning_output_tokens"] > 0  # the scripted <think> block came back as reasoning


def test_codex_tool_loop_over_the_socket_then_resume(scripted_server, tmp_path, spy):
    home = codex_home(tmp_path / "home", scripted_server.base_url, websockets=True)
    run = run_codex(home, tmp_path / "work", "Please run echo hello", key=KEY)
    check_tool_loop(run)
    frames = [f for f in spy["frames"] if hasattr(f, "request")]
    assert [f.generate for f in frames] == [False, True, True]  # prewarm, then two turns
    prewarm, first, second = frames
    assert first.request.previous_response_id is not None  # continues from the prewarm
    assert second.request.previous_response_id is not None
    # Only the new item goes up: the function call's output (Codex resends nothing else).
    assert [type(i).__name__ for i in second.request.input] == ["FunctionCallOutput"]
    usages = [o.usage for _, o in spy["outcomes"]]
    assert len(usages) == 3
    for before, after in zip(usages, usages[1:]):
        # Each turn's prompt extends the last one: all of it but the last partial block cached.
        assert after.cached_tokens >= before.input_tokens - 16, usages

    spy["frames"].clear()
    spy["outcomes"].clear()
    last_prompt = usages[-1].input_tokens
    resumed = run_codex(home, tmp_path / "work", "What did the command print?", key=KEY, resume=True)
    assert resumed.rc == 0, resumed.stderr[-2000:]
    assert resumed.items("agent_message")[-1]["text"] == "It printed hello."
    frames = [f for f in spy["frames"] if hasattr(f, "request")]
    assert [f.generate for f in frames] == [False, True]  # a new socket: prewarm, then the turn
    turn = frames[1].request
    kinds = [type(i).__name__ for i in turn.input]
    # The whole earlier conversation is sent again: the call, its output and the answer.
    assert "FunctionCall" in kinds and "FunctionCallOutput" in kinds
    usage = spy["outcomes"][-1][1].usage
    assert usage.cached_tokens >= last_prompt - 16  # the earlier turn's prompt, from the prefix cache


@pytest.mark.slow
@pytest.mark.parametrize("websockets", [False, True], ids=["http", "socket"])
def test_codex_one_turn_with_smollm2(tmp_path, websockets):
    """The product command serving SmolLM2; Codex's own instructions (~4k tokens) are
    replaced in the model catalog so its prompt fits SmolLM2's 8k context. Codex sets no
    output limit, so the server's caps an answer at 512 tokens: a sample that rambles to
    the end of the context (~2.7k tokens) took a CI run past its 300 s once."""
    with ServedProcess("+model=smollm2-135m", "engine.max_num_seqs=4", "engine.cpu_threads=2",
                       "server.max_output_tokens=512") as server:
        base = server.base_url
        home = codex_home(tmp_path / "home", base, model="smollm2-135m", websockets=websockets,
                          instructions=SMALL_MODEL_INSTRUCTIONS, context_window=8192)
        run = run_codex(home, tmp_path / "work", "Say hello in one short sentence.", key=KEY)
        if run.rc != 0:
            # Codex sends no temperature, so SmolLM2-135M samples at 1.0 and, rarely, a
            # sample goes wrong for Codex (an exit 1 seen once in CI, cause not pinned
            # down; or a run out of time); the wire is the same either way, and the
            # scripted tests pin exact behaviour. One more try; its events are what the
            # assertion shows.
            print("codex run 1 failed:", run.events[-4:], run.stderr[-500:])
            run = run_codex(home, tmp_path / "work2", "Say hello in one short sentence.", key=KEY)
        assert run.rc == 0, (run.events[-4:], run.stderr[-1000:])
        [answer] = run.items("agent_message")
        assert answer["text"].strip()
        assert run.events[-1]["type"] == "turn.completed"
    out = server.output
    assert KEY not in out


def check_patch_loop(run, workdir) -> None:
    assert run.rc == 0, (run.events[-4:], run.stderr[-2000:])
    assert (workdir / "notes.txt").read_text() == "written by ignis\n"  # the file on disk changed
    [change] = run.items("file_change")
    assert change["status"] == "completed"
    [answer] = run.items("agent_message")
    assert answer["text"] == "I added the note."


@pytest.mark.parametrize("websockets", [False, True], ids=["http", "socket"])
def test_codex_default_tools_and_freeform_apply_patch(scripted_server, tmp_path, spy, websockets):
    """Codex's default tool set (web search off): its multi-agent namespace tool, its goal
    tools and the freeform apply_patch, a custom tool whose Lark grammar holds the patch."""
    home = codex_home(tmp_path / "home", scripted_server.base_url, websockets=websockets, freeform_apply_patch=True)
    run = run_codex(home, tmp_path / "work", "Add a note file, please.", key=KEY, disable=())
    check_patch_loop(run, tmp_path / "work")
    if websockets:
        first = next(f for f in spy["frames"] if hasattr(f, "request") and f.generate)
        tools = first.request.tools
        assert any(t.namespace for t in tools) and any(t.is_custom and t.name == "apply_patch" for t in tools)
        kinds = [type(i).__name__ for f in spy["frames"] if hasattr(f, "request") for i in f.request.input]
        assert "CustomToolCallOutput" in kinds


def test_codex_output_schema(scripted_server, tmp_path):
    """`codex exec --output-schema FILE` (Codex's default tool set): the final message is
    JSON that validates against FILE, held to it by the grammar."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
              "additionalProperties": False}  # the schema of the recorded case http_output_schema
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    home = codex_home(tmp_path / "home", scripted_server.base_url, websockets=False, freeform_apply_patch=True)
    run = run_codex(home, tmp_path / "work", "Say hi as JSON.", key=KEY, disable=(), output_schema=path)
    assert run.rc == 0, (run.events[-4:], run.stderr[-2000:])
    [answer] = run.items("agent_message")
    jsonschema.validate(json.loads(answer["text"]), schema)


def test_codex_reads_the_served_catalog(scripted_server, tmp_path, spy):
    """No catalog file: `model_catalog_url` points Codex at GET /v1/models. It sends the
    served instructions and, as the served entry asks, the freeform apply_patch; under
    `--sandbox workspace-write` the patch lands, under the default read-only one it does not."""
    from ignis.server.codex_catalog import INSTRUCTIONS

    home = codex_home(tmp_path / "home", scripted_server.base_url, websockets=True, served_catalog=True)
    assert not (tmp_path / "home" / "catalog.json").exists()
    run = run_codex(home, tmp_path / "work", "Add a note file, please.", key=KEY, sandbox="workspace-write")
    check_patch_loop(run, tmp_path / "work")
    prewarm = next(f for f in spy["frames"] if hasattr(f, "request"))  # the whole prompt; turns continue it
    assert not prewarm.generate
    assert INSTRUCTIONS in [i.text for i in prewarm.request.input if getattr(i, "role", None) == "developer"]
    assert any(t.is_custom and t.name == "apply_patch" for t in prewarm.request.tools)
    read_only = run_codex(home, tmp_path / "ro", "Add a note file, please.", key=KEY, sandbox="read-only")
    assert not (tmp_path / "ro" / "notes.txt").exists(), read_only.events[-4:]
