"""Which llama-server endpoints generate text, and how each renders into a chat prompt.

Owns the request side of every generation endpoint llama-server b11434 serves:

- :data:`ENDPOINTS`: path → kind (``chat``, ``messages``, ``responses``, ``completion``);
- :func:`to_chat`: the OpenAI chat-completions body llama-server itself renders for a
  request. ``/v1/messages`` (Anthropic) and ``/v1/responses`` (OpenAI Responses) are
  converted as llama-server converts them before applying the chat template
  (``server_chat_convert_anthropic_to_oai`` and ``server_chat_convert_responses_to_chatcmpl``
  in ``tools/server/server-chat.cpp``), so ``/apply-template`` on the result gives the
  prompt the real request will be tokenized from. Only what reaches the template is
  kept faithfully (messages, tools, tool_choice, chat_template_kwargs, ...); sampling
  fields do not change the prompt. A request llama-server would refuse raises
  :class:`ValueError` (the proxy then forwards it untouched and llama-server answers);
- :func:`strip_billing_header`: Claude Code's per-prompt ``x-anthropic-billing-header``
  system block (docs/llama.md, "Claude Code's billing header").

Pure functions over parsed JSON; no HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

__all__ = [
    "BILLING_HEADER",
    "ENDPOINTS",
    "EndpointKind",
    "completion_prompt",
    "strip_billing_header",
    "to_chat",
]

EndpointKind = Literal["chat", "messages", "responses", "completion"]

ENDPOINTS: Mapping[str, EndpointKind] = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
    "/responses": "responses",
    "/completion": "completion",
    "/completions": "completion",
    "/v1/completions": "completion",
}

BILLING_HEADER = "x-anthropic-billing-header:"


def _text(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def to_chat(kind: EndpointKind, body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat-completions body llama-server renders for ``body`` sent to an endpoint of
    ``kind`` (``chat``: the body itself)."""
    if kind == "chat":
        return dict(body)
    if kind == "messages":
        return _anthropic_to_chat(body)
    if kind == "responses":
        return _responses_to_chat(body)
    raise ValueError(f"{kind} requests have no chat form")


def completion_prompt(body: Mapping[str, Any]) -> str | list[int] | None:
    """The prompt of a raw completion request: one string or one token list; None for
    the shapes that are not one prompt (several prompts, mixed lists, multimodal)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return str(prompt[0])
    return None


# -- Anthropic Messages ---------------------------------------------------------------------


def _anthropic_system(system: Any) -> str | None:
    if isinstance(system, str):
        return _normalize_cch(system)
    if isinstance(system, list):
        return "".join(
            _normalize_cch(_text(b, "text"))
            for b in system
            if isinstance(b, Mapping) and b.get("type") == "text"
        )
    return None


def _anthropic_block_result(block: Mapping[str, Any]) -> dict[str, Any]:
    tool_call_id = _text(block, "tool_use_id")
    content = block.get("content")
    if isinstance(content, str):
        return {"role": "tool", "tool_call_id": tool_call_id, "content": content}
    if isinstance(content, list):
        parts: list[dict[str, Any]] = []
        text = ""
        images = False
        for c in content:
            if not isinstance(c, Mapping):
                continue
            if c.get("type") == "text":
                text += _text(c, "text")
                parts.append({"type": "text", "text": _text(c, "text")})
            elif c.get("type") == "image":
                images = True
                url = _image_url(c.get("source"))
                if url is not None:
                    parts.append({"type": "image_url", "image_url": {"url": url}})
        return {"role": "tool", "tool_call_id": tool_call_id, "content": parts if images else text}
    return {"role": "tool", "tool_call_id": tool_call_id, "content": ""}


def _image_url(source: Any) -> str | None:
    if not isinstance(source, Mapping):
        return None
    if source.get("type") == "base64":
        media = source.get("media_type")
        media = media if isinstance(media, str) else "image/jpeg"
        return f"data:{media};base64,{_text(source, 'data')}"
    if source.get("type") == "url":
        return _text(source, "url")
    return None


def _anthropic_message(msg: Any) -> list[Any]:
    if not isinstance(msg, Mapping):
        return [msg]
    role = _text(msg, "role")
    if "content" not in msg:
        return [] if role == "assistant" else [msg]
    content = msg["content"]
    if not isinstance(content, list):
        return [msg]
    converted: list[Any] = []
    tool_calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    reasoning = ""
    for block in content:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if not isinstance(block, Mapping):
            continue
        if kind == "text":
            converted.append(block)
        elif kind == "thinking":
            reasoning += _text(block, "thinking")
        elif kind == "image":
            url = _image_url(block.get("source"))
            if url is not None:
                converted.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "tool_use":
            args = block.get("input", {})
            tool_calls.append(
                {
                    "id": _text(block, "id"),
                    "type": "function",
                    "function": {
                        "name": _text(block, "name"),
                        # nlohmann's dump(): compact, non-ASCII kept as UTF-8.
                        "arguments": json.dumps(
                            args if isinstance(args, Mapping) else {},
                            separators=(",", ":"),
                            ensure_ascii=False,
                        ),
                    },
                }
            )
        elif kind == "tool_result":
            results.append(_anthropic_block_result(block))
    out: list[Any] = []
    if converted or tool_calls or reasoning:
        new: dict[str, Any] = {"role": role}
        if converted:
            new["content"] = converted
        else:
            new["content"] = ""
        if tool_calls:
            new["tool_calls"] = tool_calls
        if reasoning:
            new["reasoning_content"] = reasoning
        out.append(new)
    out.extend(results)
    return out


def _anthropic_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    messages: list[Any] = []
    system = body.get("system")
    if system is not None:
        text = _anthropic_system(system)
        messages.append({"role": "system", "content": text or ""})
    if "messages" not in body:
        raise ValueError("'messages' is required")
    raw = body["messages"]
    if isinstance(raw, list):
        for msg in raw:
            messages.extend(_anthropic_message(msg))
    out: dict[str, Any] = {"messages": messages}
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": _text(t, "name") if isinstance(t, Mapping) else "",
                    "description": _text(t, "description") if isinstance(t, Mapping) else "",
                    "parameters": t["input_schema"]
                    if isinstance(t, Mapping) and "input_schema" in t
                    else {},
                },
            }
            for t in tools
        ]
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping):
        if choice.get("type") == "auto":
            out["tool_choice"] = "auto"
        elif choice.get("type") in ("any", "tool"):
            out["tool_choice"] = "required"
    if "chat_template_kwargs" in body:
        out["chat_template_kwargs"] = body["chat_template_kwargs"]
    return out


def _normalize_cch(text: str) -> str:
    """llama-server's ``normalize_anthropic_billing_header``: the 5-character ``cch=``
    stamp of a billing header becomes ``fffff`` (it changes on every request)."""
    if not text.startswith(BILLING_HEADER):
        return text
    at = text.find("cch=", len(BILLING_HEADER))
    start = at + 4
    if at < 0 or text[start + 5 : start + 6] != ";":
        return text
    return text[:start] + "fffff" + text[start + 5 :]


def strip_billing_header(body: dict[str, Any]) -> str | None:
    """Remove Claude Code's billing-header block from an Anthropic body, in place: the
    first text block of a ``system`` list when it starts with
    ``x-anthropic-billing-header:``. Returns the removed text, or None (body unchanged)."""
    system = body.get("system")
    if not isinstance(system, list) or not system:
        return None
    first = system[0]
    if not isinstance(first, Mapping) or first.get("type") != "text":
        return None
    text = first.get("text")
    if not isinstance(text, str) or not text.startswith(BILLING_HEADER):
        return None
    body["system"] = system[1:]
    return text


# -- OpenAI Responses -----------------------------------------------------------------------


def _responses_item(item: Any, messages: list[dict[str, Any]]) -> None:
    """Append one ``/v1/responses`` input item to ``messages`` as llama-server's own
    conversion does (its errors word for word): an assistant item right after an
    assistant message merges into it."""
    if not isinstance(item, Mapping):
        raise ValueError("Cannot determine type of 'item'")
    item = dict(item)
    merge_prev = bool(messages) and messages[-1].get("role") == "assistant"
    if isinstance(item.get("content"), str):
        item["content"] = [{"text": item["content"], "type": "input_text"}]
    role, kind = item.get("role"), item.get("type")
    if isinstance(item.get("content"), list) and role in ("user", "system", "developer"):
        _input_message(item, messages)
    elif role == "assistant" and kind == "message":
        _assistant_message(item, messages, merge_prev)
    elif kind == "function_call" and all(
        isinstance(item.get(k), str) for k in ("arguments", "call_id", "name")
    ):
        call = {
            "function": {"arguments": item["arguments"], "name": item["name"]},
            "id": item["call_id"],
            "type": "function",
        }
        if merge_prev:
            messages[-1].setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "tool_calls": [call]})
    elif kind == "function_call_output" and isinstance(item.get("call_id"), str):
        messages.append(
            {
                "content": _tool_output(item.get("output")),
                "role": "tool",
                "tool_call_id": item["call_id"],
            }
        )
    elif kind == "reasoning" and isinstance(item.get("summary"), list):
        _reasoning(item, messages, merge_prev)
    else:
        raise ValueError("Cannot determine type of 'item'")


def _input_message(item: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    parts: list[dict[str, Any]] = []
    for part in item["content"]:
        ptype = part.get("type") if isinstance(part, Mapping) else None
        if ptype == "input_text" and isinstance(part, Mapping):
            if "text" not in part:
                raise ValueError("'Input text' requires 'text'")
            parts.append({"text": part["text"], "type": "text"})
        elif ptype == "input_image" and isinstance(part, Mapping):
            if "image_url" not in part:
                raise ValueError("'image_url' is required")
            parts.append({"image_url": {"url": part["image_url"]}, "type": "image_url"})
        else:
            raise ValueError("unsupported input content type")
    item.pop("type", None)
    item.pop("status", None)
    item["content"] = parts
    messages.append(item)


def _assistant_message(
    item: dict[str, Any], messages: list[dict[str, Any]], merge_prev: bool
) -> None:
    parts: list[dict[str, Any]] = []
    content = item.get("content")
    if isinstance(content, list):
        for part in content:
            ptype = part.get("type") if isinstance(part, Mapping) else None
            if ptype in ("output_text", "input_text") and isinstance(part, Mapping):
                if not isinstance(part.get("text"), str):
                    raise ValueError("'Output text' requires 'text'")
                parts.append({"text": part["text"], "type": "text"})
            elif ptype == "refusal" and isinstance(part, Mapping):
                if not isinstance(part.get("refusal"), str):
                    raise ValueError("'Refusal' requires 'refusal'")
                parts.append({"refusal": part["refusal"], "type": "refusal"})
            else:
                raise ValueError("'type' must be one of 'output_text' or 'refusal'")
    if merge_prev:
        prev = messages[-1]
        if not isinstance(prev.get("content"), list):
            prev["content"] = []
        prev["content"].extend(parts)
    else:
        item.pop("status", None)
        item.pop("type", None)
        item["content"] = parts
        messages.append(item)


def _tool_output(output: Any) -> str | list[dict[str, Any]]:
    """A ``function_call_output``'s output as a tool message's content."""
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        raise ValueError("Cannot determine type of 'item'")
    outputs = []
    for given in output:
        if not isinstance(given, Mapping) or given.get("type") not in (
            "input_text",
            "input_image",
        ):
            raise ValueError("Output of tool call should be 'Input text' or 'Input image'")
        part = dict(given)
        if part["type"] == "input_text":
            part["type"] = "text"
        else:
            part["type"] = "image_url"
            part["image_url"] = {"url": part.get("image_url")}
        outputs.append(part)
    return outputs


def _reasoning(item: dict[str, Any], messages: list[dict[str, Any]], merge_prev: bool) -> None:
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise ValueError("item['content'] is not a non-empty array")
    first = content[0]
    if not isinstance(first, Mapping) or not isinstance(first.get("text"), str):
        raise ValueError("item['content']['text'] is not a string")
    if merge_prev:
        messages[-1]["reasoning_content"] = first["text"]
    else:
        messages.append({"role": "assistant", "content": [], "reasoning_content": first["text"]})


def _responses_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    if "input" not in body:
        raise ValueError("'input' is required")
    if _text(body, "previous_response_id"):
        raise ValueError("llama.cpp does not support 'previous_response_id'")
    out = {k: v for k, v in body.items() if k not in ("input", "instructions")}
    messages: list[dict[str, Any]] = []
    if "instructions" in body:
        messages.append({"role": "system", "content": _text(body, "instructions")})
    value = body["input"]
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        for item in value:
            _responses_item(item, messages)
    else:
        raise ValueError("'input' must be a string or array of objects")
    out["messages"] = messages
    if "tools" in body:
        tools = body["tools"]
        if not isinstance(tools, list):
            raise ValueError("'tools' must be an array of objects")
        converted = []
        for tool in tools:
            if not isinstance(tool, Mapping) or tool.get("type") != "function":
                continue  # llama-server skips non-function tools (with a warning)
            function = {k: v for k, v in tool.items() if k != "type"}
            function.setdefault("strict", True)
            converted.append({"type": "function", "function": function})
        out.pop("tools", None)
        if converted:
            out["tools"] = converted
    if "max_output_tokens" in body:
        out.pop("max_output_tokens", None)
        out["max_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if isinstance(reasoning, Mapping) and "effort" in reasoning:
            out["reasoning_effort"] = reasoning["effort"]
        out.pop("reasoning", None)
    return out
