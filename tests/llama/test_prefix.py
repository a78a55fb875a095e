"""Stable-prefix extraction at Pi's boundary markers (pure units)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pion_testing.llama_samples import pi_chat_body, pi_system_prompt

from pion.llama.config import DEFAULT_MARKERS
from pion.llama.prefix import PrefixSkip, WarmRequest, split_prefix, warm_request_from_chat


def test_pi_prompt_is_cut_before_project_context() -> None:
    text = pi_system_prompt()
    prefix = split_prefix(text, DEFAULT_MARKERS)
    assert prefix is not None
    assert prefix.endswith("</rules>\n")
    assert text.startswith(prefix)
    assert "<project_context>" not in prefix and "<cwd>" not in prefix


def test_earliest_marker_wins_whatever_the_order() -> None:
    text = "stable\nCurrent working directory: /x\n<cwd>\n/x\n</cwd>\n<project_context>\n"
    assert split_prefix(text, DEFAULT_MARKERS) == "stable"


def test_each_marker_alone() -> None:
    for marker in DEFAULT_MARKERS:
        assert split_prefix("a\nb" + marker + " tail", DEFAULT_MARKERS) == "a\nb"


def test_no_marker_means_no_prefix() -> None:
    assert split_prefix("no markers here, <cwd> without a newline", DEFAULT_MARKERS) is None


def test_markers_are_configurable() -> None:
    assert split_prefix("keep this\n## Session\nvariable", ["\n## Session"]) == "keep this"


def test_warm_request_carries_rendering_keys_and_identity() -> None:
    body = pi_chat_body(chat_template_kwargs={"enable_thinking": False}, tool_choice="auto")
    body["temperature"] = 0.2  # not a rendering key: the warm-up must not copy it
    found = warm_request_from_chat(body, DEFAULT_MARKERS, harness="pi/1")
    assert isinstance(found, WarmRequest)
    assert set(found.render) == {"tools", "chat_template_kwargs", "tool_choice"}
    assert found.model == "pion-test" and found.harness == "pi/1" and found.role == "system"
    warm = found.body("", n_predict=0)
    assert warm["messages"] == [
        {"role": "system", "content": found.prefix},
        {"role": "user", "content": ""},
    ]
    assert warm["n_predict"] == 0 and "temperature" not in warm


def test_developer_role_and_single_text_part() -> None:
    body = pi_chat_body()
    text = body["messages"][0]["content"]
    body["messages"][0] = {"role": "developer", "content": [{"type": "text", "text": text}]}
    found = warm_request_from_chat(body, DEFAULT_MARKERS)
    assert isinstance(found, WarmRequest) and found.role == "developer" and found.parts
    assert found.system_message()["content"] == [{"type": "text", "text": found.prefix}]


def test_skips_say_why() -> None:
    cases = {
        "no messages": {},
        "first message is not system/developer": {"messages": [{"role": "user", "content": "x"}]},
        "system content is not one text": {
            "messages": [{"role": "system", "content": [{"type": "image_url"}]}]
        },
        "no boundary marker in the system prompt": {
            "messages": [{"role": "system", "content": "plain"}]
        },
        "empty prefix before the boundary marker": {
            "messages": [{"role": "system", "content": "\n<cwd>\n/x\n</cwd>"}]
        },
    }
    for reason, body in cases.items():
        assert warm_request_from_chat(body, DEFAULT_MARKERS) == PrefixSkip(reason)


@given(st.text(), st.text())
def test_prefix_is_a_marker_free_head(head: str, tail: str) -> None:
    text = head + "\n<cwd>" + tail
    prefix = split_prefix(text, DEFAULT_MARKERS)
    assert prefix is not None and text.startswith(prefix)
    assert not any(m in prefix for m in DEFAULT_MARKERS)
