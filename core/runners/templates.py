"""A model folder's chat templates, read from its files (no tokenizer loaded).

transformers keeps them in `chat_template.jinja`, `chat_template.json`
(`{"chat_template": ...}`), `additional_chat_templates/*.jinja`, or in
`tokenizer_config.json` (`chat_template`: one template, or a list of
`{"name", "template"}`). A tokenizer's response template (how its answers are
read) is kept in `tokenizer_config.json` too.
"""

from __future__ import annotations

import json
from pathlib import Path


def folder_chat_templates(folder: str | Path) -> list[str]:
    """Every chat template the folder carries (none when it is not a folder or has none)."""
    root = Path(folder)
    if not root.is_dir():
        return []
    out = [p.read_text(encoding="utf-8") for p in (root / "chat_template.jinja",) if p.is_file()]
    extra = root / "additional_chat_templates"
    if extra.is_dir():
        out += [p.read_text(encoding="utf-8") for p in sorted(extra.glob("*.jinja"))]
    for name in ("chat_template.json", "tokenizer_config.json"):
        path = root / name
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
        except (ValueError, AttributeError):
            continue
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, list):
            out += [t["template"] for t in value
                    if isinstance(t, dict) and isinstance(t.get("template"), str)]
    return out


def folder_response_template(folder: str | Path) -> dict | None:
    """The folder's response template (`response_template` in `tokenizer_config.json`, where
    transformers saves a tokenizer's), or None."""
    path = Path(folder) / "tokenizer_config.json"
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("response_template")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, dict) else None
