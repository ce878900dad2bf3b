"""Spans of the web app's requests and of MCP tool calls over HTTP (`reflective_memory.tracing`).

Each HTTP request is a server span named for its route's template (never its path, which holds
a user id) that continues the caller's trace; the memory's operations are its descendants. Each
MCP tool call is a `tools/call <tool>` span with the memory's operations inside. No span holds
user text or a raw user id.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from reflective_memory import tracing
from reflective_memory.serve.answer import LLMAnswerer
from serve_helpers import ANA_S1, client_for, csrf, live_server

from tests.conftest import assert_no_text

pytest.importorskip("opentelemetry.sdk")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _ancestors(finished: Any, span: Any) -> list[str]:
    """The names of a span's ancestors, nearest first."""
    by_id = {s.context.span_id: s for s in finished}
    out = []
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        out.append(span.name)
    return out


def test_a_web_request_is_a_server_span_of_its_route_around_the_memory_calls(
    smem: Any, spans: Any
) -> None:
    answer = "Pixel chewed your running shoes. [0]"
    client = client_for(smem, answerer=LLMAnswerer(lambda prompt: answer))
    query = "what did the puppy chew"
    r = client.get(
        "/api/users/ana/search", params={"q": query}, headers={"traceparent": TRACEPARENT}
    )
    assert r.status_code == 200
    token = csrf(client)
    message = "Pixel now sleeps in a basket by the window."
    sent = client.post(
        "/api/users/ana/chat", json={"message": message}, headers={"x-csrf-token": token}
    )
    assert sent.status_code == 200, sent.text
    assert client.get("/api/users/nobody-here/search", params={"q": query}).status_code == 404
    finished = spans.get_finished_spans()
    search, *_ = [s for s in finished if s.name == "GET /api/users/{user_id}/search"]
    assert search.kind.name == "SERVER" and search.parent.span_id == 0x00F067AA0BA902B7
    assert format(search.context.trace_id, "032x") == TRACE_ID  # the caller's trace goes on
    assert search.attributes["http.route"] == "/api/users/{user_id}/search"
    assert search.attributes["http.request.method"] == "GET"
    assert search.attributes["http.response.status_code"] == 200
    (retrieval,) = [
        s
        for s in finished
        if s.name == tracing.RETRIEVAL_SPAN and s.context.trace_id == search.context.trace_id
    ]
    assert _ancestors(finished, retrieval) == [search.name]
    assert retrieval.attributes["enduser.pseudo.id"] == tracing.pseudonym("ana")
    chat = next(s for s in finished if s.name == "POST /api/users/{user_id}/chat")
    inside = {s.name for s in finished if chat.name in _ancestors(finished, s)}
    assert {"add_turns", tracing.RETRIEVAL_SPAN, "dense", "text_completion"} <= inside
    missing = [s for s in finished if s.attributes.get("http.response.status_code") == 404]
    assert missing and missing[0].status.status_code.name == "UNSET"  # a client's error
    assert_no_text(finished, query, message, answer, "nobody-here", *ANA_S1, "/api/users/ana")
    assert not [s for s in finished if "ana" in s.attributes.values()]


def test_mcp_tool_calls_over_http_are_spans_around_the_memory_calls(smem: Any, spans: Any) -> None:
    pytest.importorskip("mcp")
    from reflective_memory.serve.mcp import TokenUsers, build_server, http_app, token_user
    from reflective_memory.serve.security import AccessPolicy
    from test_mcp_server import ANA, PIXEL, _http_calls

    policy = AccessPolicy(None, {"ana": ANA})
    server = build_server(smem, token_user, verifier=TokenUsers(policy))
    with live_server(http_app(server, 64 * 1024), lifespan="on") as port:
        url = f"http://127.0.0.1:{port}/mcp"
        calls = [
            ("remember", {"session_id": "h1", "turns": PIXEL, "end_session": True}),
            ("recall", {"query": "What is my dog called?"}),
            ("forget", {"session_id": "no-such-session"}),
        ]
        done, recalled, refused = asyncio.run(_http_calls(url, ANA, calls))
    assert not done.isError and not recalled.isError and refused.isError
    finished = spans.get_finished_spans()
    tools = {s.name: s for s in finished if s.name.startswith("tools/call ")}
    assert set(tools) == {"tools/call remember", "tools/call recall", "tools/call forget"}
    for name, span in tools.items():
        assert span.kind.name == "SERVER"
        assert span.attributes["mcp.method.name"] == "tools/call"
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert span.attributes["gen_ai.tool.name"] == name.split()[1]
    assert tools["tools/call forget"].attributes["error.type"].endswith("ToolError")
    inside = {t: {s.name for s in finished if t in _ancestors(finished, s)} for t in tools}
    assert {"add_turns", "end_session"} <= inside["tools/call remember"]
    assert {tracing.RETRIEVAL_SPAN, "dense"} <= inside["tools/call recall"]
    posts = [s for s in finished if s.name == "POST /mcp"]
    assert posts and all(s.attributes["http.route"] == "/mcp" for s in posts)
    texts = [t["text"] for t in PIXEL]
    assert_no_text(finished, "What is my dog called?", "no-such-session", ANA, "h1", *texts)
