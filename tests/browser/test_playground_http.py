"""The Playground's files over plain HTTP: served at / without a key, with a strict
CSP, and shipped inside the package (so an installed ignis serves them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ignis.server.playground_routes import PLAYGROUND_DIR
from tests.server.server_harness import http

ASSETS = ["app.js", "connection.js", "pane.js", "settings.js", "transcript.js", "style.css"]


@pytest.fixture(scope="module")
def srv(start_server):
    return start_server()


def test_page_is_served_at_root_without_a_key(srv):
    r = http(srv, "GET", "/", key=None)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "<title>ignis Playground</title>" in r.text
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    # Everything the page loads is one of our files: no CDN.
    refs = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert refs and all(ref.startswith("/playground/") for ref in refs)


@pytest.mark.parametrize("name", ASSETS)
def test_assets_are_served_with_their_types(srv, name):
    r = http(srv, "GET", f"/playground/{name}", key=None)
    assert r.status_code == 200
    want = "text/css" if name.endswith(".css") else "javascript"
    assert want in r.headers["content-type"]
    assert r.content == (PLAYGROUND_DIR / name).read_bytes()


def test_unknown_files_and_escapes_are_404(srv):
    assert http(srv, "GET", "/playground/nope.js", key=None).status_code == 404
    assert http(srv, "GET", "/playground/..%2Fapp.py", key=None).status_code in (400, 404)
    # /v1 stays behind the key, and the page's routes shadow nothing of it.
    assert http(srv, "GET", "/v1/models", key=None).status_code == 401


def test_every_module_import_is_a_shipped_file():
    for path in PLAYGROUND_DIR.glob("*.js"):
        for ref in re.findall(r'from "\./([^"]+)"', path.read_text()):
            assert (PLAYGROUND_DIR / ref).is_file(), f"{path.name} imports a missing {ref}"
    assert set(ASSETS) | {"index.html"} <= {p.name for p in PLAYGROUND_DIR.iterdir()}


def test_pyproject_ships_the_playground_as_package_data():
    import tomllib

    root = Path(__file__).resolve().parents[2]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = [pat for pats in data.values() for pat in pats]
    for name in [*ASSETS, "index.html"]:
        assert any(Path(name).match(pat.rsplit("/", 1)[-1]) for pat in patterns), name
