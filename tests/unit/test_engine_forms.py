"""The replica form of each engine kind is generated from the engine's typed config struct:
every field has words, its widget follows its type, and what the form sends is checked and
converted by the engine's own parse_config (a refusal names the key)."""

from __future__ import annotations

import pytest
from laneway.admin.engine_forms import SHADOWED, config_fields, described, form_values, read_config
from laneway.engines.config import EngineConfigError
from laneway.engines.kinds import engine_kind, engine_kind_names


@pytest.mark.parametrize("kind", engine_kind_names())
def test_every_config_field_is_in_the_form_with_words(kind: str) -> None:
    cls = engine_kind(kind).config
    assert described(cls) == []  # a new field gets a label, unit and help here
    names = [f.help.name for f in config_fields(kind)]
    assert sorted(names) == sorted(set(cls.__struct_fields__) - SHADOWED)
    required = [f.help.name for f in config_fields(kind) if f.required]
    assert names[: len(required)] == required  # the required ones come first


def test_widgets_follow_the_field_types() -> None:
    fields = {f.help.name: f.help for f in config_fields("vllm", lanes=["interactive", "batch"])}
    assert fields["base_url"].kind == "text" and fields["base_url"].placeholder == "required"
    assert fields["embeddings"].kind == "checkbox"
    assert fields["max_concurrency"].kind == "number" and fields["max_concurrency"].step == "1"
    assert fields["metrics_poll_s"].step == "any" and fields["metrics_poll_s"].unit == "seconds"
    assert [v for v, _ in fields["tokenize"].choices] == ["", "auto", "always", "never"]
    assert fields["lanes"].kind == "checks" and [v for v, _ in fields["lanes"].choices] == ["interactive", "batch"]
    assert fields["api_key"].kind == "secret" and fields["extra_body"].kind == "lines"
    llama = {f.help.name: f.help for f in config_fields("llamacpp")}
    assert llama["pooling"].kind == "select" and llama["ban_tokens"].kind == "text"


def test_a_form_becomes_the_typed_config_without_its_blanks() -> None:
    form = {
        "config.base_url": "http://vllm-1:8000",
        "config.max_concurrency": "16",
        "config.metrics_poll_s": "",
        "config.shared_slots": "",
        "config.tool_calling": "true",
        "config.tokenize": "never",
        "config.extra_body": 'top_k = 20\nchat_template_kwargs = {"thinking": false}',
        "config.stop": "###\n\nEND\n",
    }
    config = read_config("vllm", form, {"config.lanes": ["batch"]})
    assert config == {
        "base_url": "http://vllm-1:8000",
        "max_concurrency": 16,
        "shared_slots": False,
        "tool_calling": True,
        "tokenize": "never",
        "lanes": ["batch"],
        "stop": ["###", "END"],
        "extra_body": {"top_k": 20, "chat_template_kwargs": {"thinking": False}},
    }
    shown = form_values("vllm", {**config, "api_key": "sk-secret"})
    assert shown["config.max_concurrency"] == "16" and shown["config.stop"] == "###\nEND"
    assert "config.api_key" not in shown  # a secret is never shown back
    llama = {"config.model_path": "/m.gguf", "config.ban_tokens": "1, 2", "config.batching": "true"}
    assert read_config("llamacpp", llama, {}) == {"model_path": "/m.gguf", "ban_tokens": [1, 2]}  # batching: default


@pytest.mark.parametrize(
    ("kind", "form", "key", "words"),
    [
        ("vllm", {}, "base_url", "vllm needs config key 'base_url'"),
        ("sim", {"config.max_concurrency": "many"}, "max_concurrency", "'many'"),
        ("vllm", {"config.base_url": "http://x", "config.tokenize": "sometimes"}, "tokenize", "auto, always, never"),
    ],
)
def test_a_refusal_names_the_key_in_the_engines_words(kind: str, form: dict[str, str], key: str, words: str) -> None:
    with pytest.raises(EngineConfigError) as refused:
        read_config(kind, form, {})
    assert refused.value.key == key and words in str(refused.value)
