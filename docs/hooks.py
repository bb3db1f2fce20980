"""MkDocs hook: reference tables generated from the code when the docs are built, so they
cannot drift.

    <!-- reference: config -->     every configuration key (ignis/config.py): type, default, help
    <!-- reference: metrics -->    every Prometheus series the server exports (ignis/server/metrics.py)
    <!-- reference: families -->   the model families the loaders know (ignis/model/families)

A page holds the marker; `on_page_markdown` (mkdocs.yml `hooks:`) puts the table there. The help text of a configuration key is the comment written above it (and beside it)
in ignis/config.py, which is where the code documents it anyway.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import io
import re
import tokenize
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!--\s*reference:\s*([a-z_]+)\s*-->")


# -- configuration ---------------------------------------------------------------------------


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on that line (text after '#')."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def field_help(path: Path = ROOT / "ignis" / "config.py") -> dict[tuple[str, str], str]:
    """(class name, attribute name) -> its help: the comment lines right above it, then the
    comment beside it. Enum members count too (their comments explain the choices)."""
    source = path.read_text()
    comments = _comments(source)
    lines = source.splitlines()
    out: dict[tuple[str, str], str] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            target = stmt.target if isinstance(stmt, ast.AnnAssign) else (
                stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None)
            if not isinstance(target, ast.Name):
                continue
            n = stmt.lineno - 1
            above = []
            while n >= 1 and lines[n - 1].strip().startswith("#"):
                above.insert(0, comments.get(n, ""))
                n -= 1
            beside = comments.get(stmt.lineno)
            out[(node.name, target.id)] = " ".join(part for part in [*above, beside or ""] if part)
    return out


def _enum_help(tp: type) -> str:
    helps = field_help()
    parts = [f"`{m.value}`: {helps[(tp.__name__, m.name)]}" for m in tp if helps.get((tp.__name__, m.name))]
    return " ".join(f"{p}." if not p.endswith(".") else p for p in parts)


def _type_name(tp: object) -> str:
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "(required)"
    if isinstance(value, enum.Enum):
        value = value.value
    if dataclasses.is_dataclass(value):
        return "(group)"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value!r}`" if isinstance(value, str | list) else f"`{value}`"


def config_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) for every leaf key of IgnisConfig, groups in order."""
    from ignis.config import IgnisConfig

    help_ = field_help()
    rows: list[tuple[str, str, str, str]] = []

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            key = f"{prefix}{f.name}"
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{key}.")
                continue
            text = help_.get((cls.__name__, f.name), "")
            if isinstance(tp, type) and issubclass(tp, enum.Enum):
                text = " ".join(t for t in (text, _enum_help(tp)) if t)
            rows.append((key, _type_name(tp), _default(f), text))

    walk(IgnisConfig, "")
    return rows


def config_table() -> str:
    lines = ["| key | type | default | what it does |", "| --- | --- | --- | --- |"]
    for key, tp, default, text in config_rows():
        lines.append(f"| `{key}` | {tp} | {default} | {text.replace('|', chr(92) + '|')} |")
    return "\n".join(lines)


# -- metrics -----------------------------------------------------------------------------------


def metric_rows() -> list[tuple[str, str, str, str]]:
    """(name as scraped, type, labels, help) for every series a fresh server registry holds."""
    from ignis.engine.engine import EngineStats
    from ignis.server.metrics import Metrics

    class _Engine:  # what the collector reads at scrape time: an idle engine's numbers
        stats = EngineStats()
        healthy = True

    class _Cache:
        tokenized = reused = 0

    metrics = Metrics(_Engine(), queued=lambda: 0, sockets=lambda: 0, token_cache=_Cache())
    # A labelled series has no samples until it is used: its label names are the metric's own.
    labelled = {m._name: m._labelnames for m in vars(metrics).values() if hasattr(m, "_labelnames")}
    rows = []
    for family in metrics.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = labelled.get(family.name, ())
        rows.append((name, family.type, ", ".join(labels), family.documentation))
    return sorted(rows)


def metrics_table() -> str:
    lines = ["| series | type | labels | what it counts |", "| --- | --- | --- | --- |"]
    for name, kind, labels, doc in metric_rows():
        lines.append(f"| `{name}` | {kind} | {labels or '-'} | {doc} |")
    return "\n".join(lines)


# -- model families ------------------------------------------------------------------------------


def families_table() -> str:
    """One row per model family the loaders know: the config.json model_type and GGUF
    general.architecture names that select it."""
    try:
        from ignis.model.families import FAMILY_NAMES, GGUF_ARCHS, HF_MODEL_TYPES
    except ImportError:  # before the family registry: the loaders' own tables
        from ignis.model.gguf_loader import _ARCH_FAMILY as GGUF_ARCHS
        from ignis.model.hf_loader import _FAMILY as HF_MODEL_TYPES

        FAMILY_NAMES = tuple(dict.fromkeys(HF_MODEL_TYPES.values()))
    lines = ["| family | Hugging Face `model_type` | GGUF `general.architecture` |", "| --- | --- | --- |"]
    for name in FAMILY_NAMES:
        hf = ", ".join(f"`{k}`" for k, v in HF_MODEL_TYPES.items() if v == name) or "-"
        gg = ", ".join(f"`{k}`" for k, v in GGUF_ARCHS.items() if v == name) or "-"
        lines.append(f"| {name} | {hf} | {gg} |")
    return "\n".join(lines)


TABLES = {"config": config_table, "metrics": metrics_table, "families": families_table}


def fill(markdown: str) -> str:
    """`markdown` with every reference marker replaced by its table."""
    return MARKER.sub(lambda m: TABLES[m.group(1)](), markdown)


def on_page_markdown(markdown: str, **_: object) -> str:
    return fill(markdown)


# Figures the experiments write next to their scripts, served under assets/ without a copy in docs/.
FIGURES = {"assets/vs_llamacpp.png": ROOT / "experiments" / "vs_llamacpp.png"}


def on_files(files, config, **_: object):  # mkdocs passes its Files and config
    from mkdocs.structure.files import File

    for uri, path in FIGURES.items():
        if path.exists():
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
