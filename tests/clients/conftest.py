"""The scripted server itself is a session fixture of tests/conftest.py."""

from __future__ import annotations

import pytest

import ignis.server.socket_session as socket_session


@pytest.fixture
def spy(monkeypatch):
    """What the socket side of the server received and answered: frames and usages."""
    seen = {"frames": [], "outcomes": []}
    decode = socket_session.decode_frame
    log = socket_session.log_outcome

    def decode_frame(data, **kw):
        ev = decode(data, **kw)
        seen["frames"].append(ev)
        return ev

    def log_outcome(where, response_id, outcome, **kw):
        seen["outcomes"].append((response_id, outcome))
        return log(where, response_id, outcome, **kw)

    monkeypatch.setattr(socket_session, "decode_frame", decode_frame)
    monkeypatch.setattr(socket_session, "log_outcome", log_outcome)
    return seen
