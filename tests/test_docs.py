"""The docs site: `mkdocs build --strict` passes (no broken link or anchor, no page left
out of the nav), and its reference tables are the code's, generated at build time
(docs/hooks.py): every configuration key, Prometheus series and model family appears on
its page, and a changed default changes the table."""

from __future__ import annotations

import dataclasses
import html
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_hooks():
    spec = importlib.util.spec_from_file_location("ignis_docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load_hooks()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    # No -q: mkdocs counts warnings only at the levels it logs, and strict fails on them.
    got = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], check=False, cwd=ROOT,
                         env=dict(os.environ, NO_MKDOCS_2_WARNING="1"), capture_output=True, text=True,
                         timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "WARNING" not in got.stderr, got.stderr
    return out


def page(site: Path, name: str) -> str:
    return html.unescape((site / name / "index.html").read_text(encoding="utf-8"))


def test_every_config_key_with_its_default_is_on_the_configuration_page(site: Path):
    text = page(site, "configuration")
    rows = hooks.config_rows()
    assert len(rows) > 30 and "<!-- reference" not in text
    for key, _, default, _ in rows:
        row = text[text.index(f"<td><code>{key}</code></td>"):]
        row = row[: row.index("</tr>")]
        assert default.strip("`") in row, (key, default, row)


def test_every_metric_and_family_is_on_its_page(site: Path):
    metrics = page(site, "metrics")
    for name, kind, _, _ in hooks.metric_rows():
        assert f"<code>{name}</code>" in metrics, name
    assert any(name == "ignis_requests_total" for name, *_ in hooks.metric_rows())
    models = page(site, "models")
    from ignis.model.families import FAMILY_NAMES, GGUF_ARCHS

    for name in FAMILY_NAMES:
        assert f"<td>{name}</td>" in models, name
    for arch in GGUF_ARCHS:
        assert f"<code>{arch}</code>" in models, arch


def test_a_changed_default_changes_the_table(monkeypatch: pytest.MonkeyPatch):
    from ignis.config import EngineConfig

    field = next(f for f in dataclasses.fields(EngineConfig) if f.name == "block_size")
    before = hooks.fill("<!-- reference: config -->")
    assert f"| `engine.block_size` | int | `{field.default}` |" in before
    monkeypatch.setattr(field, "default", 1234567)
    after = hooks.fill("<!-- reference: config -->")
    assert "| `engine.block_size` | int | `1234567` |" in after and before != after


def test_help_comes_from_the_comments_in_config_py():
    help_ = hooks.field_help()
    assert help_[("EngineConfig", "block_size")] == "tokens per KV-cache block"


def test_the_readme_is_short_and_connects_codex_on_its_first_screen():
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(readme) <= 150
    assert any("codex exec" in line for line in readme[:50])
