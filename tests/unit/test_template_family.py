"""Under `--tool-call-parser auto` with a `--tokenizer` folder, the family is the one the folder's chat
template shows: each known family's template (tests/support/templates/) names its family, a template
without tools or with several families' marks names none (any syntax is then read)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsched.cli.serve import _tool_parser
from fsched.core.openai.toolcalls.families import FAMILIES, family_of_template
from fsched.core.runners.templates import folder_chat_templates

TEMPLATES = Path(__file__).parent.parent / "support" / "templates"
TINY = ("{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|bos|>assistant:{% endif %}")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_template_names_its_family(family):
    assert family_of_template([(TEMPLATES / f"{family}.jinja").read_text()]) == family


def test_no_tools_or_several_families_name_none():
    assert family_of_template([TINY]) is None and family_of_template([]) is None
    both = [(TEMPLATES / "hermes.jinja").read_text(), (TEMPLATES / "mistral.jinja").read_text()]
    assert family_of_template(both) is None


def test_a_folder_template_read_from_each_place_transformers_keeps_it(tmp_path):
    hermes, mistral = (TEMPLATES / "hermes.jinja").read_text(), (TEMPLATES / "mistral.jinja").read_text()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "chat_template.jinja").write_text(hermes)
    (tmp_path / "b" / "additional_chat_templates").mkdir(parents=True)
    (tmp_path / "b" / "additional_chat_templates" / "tool_use.jinja").write_text(mistral)
    (tmp_path / "b" / "tokenizer_config.json").write_text(json.dumps({"chat_template": TINY}))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "default", "template": TINY}, {"name": "tool_use", "template": hermes}]}))
    assert folder_chat_templates(tmp_path / "a") == [hermes]
    assert sorted(folder_chat_templates(tmp_path / "b")) == sorted([mistral, TINY])
    assert folder_chat_templates(tmp_path / "c") == [TINY, hermes]
    assert folder_chat_templates(tmp_path / "none") == []
    assert [_tool_parser("auto", str(tmp_path / x)) for x in "abc"] == ["hermes", "mistral", "hermes"]
    assert _tool_parser("llama3_json", str(tmp_path / "a")) == "llama3_json"  # the operator's name stands
    assert _tool_parser("auto", str(tmp_path / "none")) == "auto" and _tool_parser("auto") == "auto"
