"""HTTP tests of every page and API route of `reflective-memory serve` (in-process client)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi")

from reflective_memory.serve.security import AccessPolicy  # noqa: E402
from serve_helpers import XSS, client_for, csrf, form_value  # noqa: E402


@pytest.fixture
def client(smem):
    return client_for(smem)


def _ids(smem, user):
    return [m.id for m in smem.memories(user)]


# ------------------------------------------------------------------ pages
def test_index_lists_users_with_counts(client):
    r = client.get("/")
    assert r.status_code == 200
    assert 'data-user-id="ana"' in r.text and 'data-user-id="bob"' in r.text
    assert r.headers["content-security-policy"].startswith("default-src 'none'")
    assert r.headers["x-frame-options"] == "DENY"


def test_user_page_shows_sessions_memories_and_provenance(client, smem):
    r = client.get("/users/ana")
    assert r.status_code == 200
    for sid in ("s1", "s2"):
        assert f'href="/users/ana/sessions/{sid}"' in r.text
    for mid in _ids(smem, "ana"):
        assert f'href="/users/ana/memories/{mid}"' in r.text
    # provenance links point at the source turns' anchors
    assert 'href="/users/ana/sessions/s1#turn-s1:0"' in r.text
    assert "Pixel" in r.text and "Lena" not in r.text  # bob's memory never shows on ana's page


def test_session_page_has_turn_anchors_and_memories(client):
    r = client.get("/users/ana/sessions/s1")
    assert r.status_code == 200
    assert 'id="turn-s1:0"' in r.text and 'id="turn-s1:3"' in r.text
    assert "Memories from this session" in r.text and "beagle" in r.text


def test_memory_page_shows_text_key_and_source_turns(client, smem):
    mid = next(m.id for m in smem.memories("ana") if m.session_id == "s1")
    r = client.get(f"/users/ana/memories/{mid}")
    assert r.status_code == 200
    assert "Source turns" in r.text and 'href="/users/ana/sessions/s1#turn-s1:0"' in r.text


@pytest.mark.parametrize(
    "path, needle",
    [
        ("/users/nobody", "no user 'nobody'"),
        ("/users/ana/sessions/nope", "user 'ana' has no session 'nope'"),
        ("/users/ana/memories/nope", "user 'ana' has no memory 'nope'"),
        ("/users/nobody/search?q=x", "no user 'nobody'"),
        ("/users/ana/sessions/nope/delete", "has no session 'nope'"),
        ("/users/ana/memories/nope/delete", "has no memory 'nope'"),
        ("/users/nobody/delete", "no user 'nobody'"),
        ("/no/such/page", "no page at /no/such/page"),
    ],
)
def test_bad_ids_are_404_with_a_clear_message(client, path, needle):
    r = client.get(path)
    assert r.status_code == 404
    assert needle in r.text.replace("&#39;", "'")


def test_memory_of_another_user_is_404(client, smem):
    bob_mid = _ids(smem, "bob")[0]
    r = client.get(f"/users/ana/memories/{bob_mid}")
    assert r.status_code == 404
    assert client.get(f"/api/users/ana/memories/{bob_mid}").status_code == 404


def test_search_page_ranks_with_diagnostics(client):
    r = client.get("/users/ana/search", params={"q": "what is my dog called", "k": "3"})
    assert r.status_code == 200
    hits = re.findall(r'<li class="hit[^"]*" id="hit-(\d+)"', r.text)
    assert hits == ["0", "1", "2"][: len(hits)] and hits
    assert "Pixel" in r.text.split('id="hit-0"')[1].split("</li>")[0]  # ana's dog
    assert 'class="hit-path path-familiarity"' in r.text or "path-recollection" in r.text
    assert "reranker" in r.text and "timings" in r.text and "score " in r.text
    assert client.get("/users/ana/search").status_code == 200  # the empty form


@pytest.mark.parametrize(
    "params",
    [{"q": "   "}, {"q": "dog", "k": "zero"}, {"q": "x", "k": "0"}, {"q": "x", "k": "500"}],
)
def test_search_bad_input_is_400(client, params):
    r = client.get("/users/ana/search", params=params)
    assert r.status_code == 400
    assert "must" in r.text


def test_open_chat_form_redirects_and_needs_a_user(client):
    r = client.get("/chat", params={"user": "carol"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/users/carol/chat"
    assert client.get("/chat", params={"user": "  "}).status_code == 400
    assert client.get("/chat").status_code == 400


def test_chat_page_for_new_user_opens_a_session(client):
    r = client.get("/users/carol/chat", follow_redirects=False)
    assert r.status_code == 303 and "/users/carol/chat?session=chat-" in r.headers["location"]
    page = client.get(r.headers["location"])
    assert page.status_code == 200 and 'id="send-form"' in page.text


def test_chat_recalls_an_earlier_session_and_cites_it(client, smem):
    token = csrf(client)
    page = client.get("/users/ana/chat?session=s3")
    assert page.status_code == 200
    r = client.post(
        "/users/ana/chat",
        data={"csrf_token": token, "session_id": "s3", "message": "What is my dog called?"},
    )
    assert r.status_code == 200 and "#ex-" in str(r.url)
    ex = re.search(r'<li class="exchange" id="ex-(\w+)"', r.text).group(1)
    panel = r.text.split(f'id="ex-{ex}"')[1]
    cited = re.search(r'<span class="ex-cited">([^<]*)</span>', panel).group(1)
    assert cited.startswith("[")
    first = int(cited[1:].split("]")[0])
    hit = panel.split(f'id="ex-{ex}-hit-{first}"')[1].split("</li>")[0]
    assert "Pixel" in hit and "hit-cited" in hit and "path-" in hit
    assert 'href="/users/ana/sessions/s1' in hit  # provenance back to session 1
    turns = smem.turns("ana", "s3")
    assert [t.role for t in turns] == ["user", "assistant"] and "Pixel" in turns[1].text
    assert "[" not in turns[1].text  # citation markers are not stored in the reply turn


def test_chat_bad_input_is_400_and_stores_nothing(client, smem):
    token = csrf(client)
    before = len(smem.turns("ana"))
    for data in (
        {"csrf_token": token, "session_id": "s3", "message": "   "},
        {"csrf_token": token, "session_id": "s3", "message": "x" * 9000},
        {"csrf_token": token, "message": "hello"},
    ):
        r = client.post("/users/ana/chat", data=data)
        assert r.status_code == 400, data
    assert len(smem.turns("ana")) == before


def test_every_post_needs_the_csrf_token(client, smem):
    ex_page = client.get("/users/ana/chat?session=s3")
    assert ex_page.status_code == 200
    mid = _ids(smem, "ana")[0]
    posts = [
        ("/users/ana/chat", {"session_id": "s3", "message": "hello"}),
        ("/users/ana/sessions/new", {}),
        ("/users/ana/sessions/s1/end", {}),
        ("/users/ana/feedback", {"exchange_id": "x", "hit": "0", "helpful": "1"}),
        ("/users/ana/delete", {}),
        ("/users/ana/sessions/s1/delete", {}),
        (f"/users/ana/memories/{mid}/delete", {}),
    ]
    for path, data in posts:
        for bad in (None, "0" * 64):
            body = dict(data) if bad is None else {**data, "csrf_token": bad}
            r = client.post(path, data=body)
            assert r.status_code == 403, path
            assert "CSRF" in r.text
    assert len(smem.memories("ana")) >= 1 and "ana" in smem.users()
    assert not smem.turns("ana", "s3")


def test_get_is_not_allowed_to_change_state(client):
    r = client.get("/users/ana/sessions/new")
    assert r.status_code == 404  # there is no session called "new"
    assert client.put("/users/ana/delete").status_code == 405


def test_new_session_ends_open_sessions(client, smem):
    token = csrf(client)
    client.post(
        "/users/ana/chat",
        data={"csrf_token": token, "session_id": "s3", "message": "I started learning the cello."},
    )
    assert smem.open_sessions("ana") == ["s3"]
    r = client.post("/users/ana/sessions/new", data={"csrf_token": token})
    assert r.status_code == 200 and "Ended 1 session(s): s3" in r.text
    assert smem.open_sessions("ana") == []
    assert any("cello" in m.text for m in smem.memories("ana"))


def test_end_session_page_route(client, smem):
    token = csrf(client)
    smem.add_turn("ana", "s4", "user", "I bought a red bicycle.")
    r = client.post("/users/ana/sessions/s4/end", data={"csrf_token": token})
    assert r.status_code == 200 and "Session s4 ended" in r.text
    assert "s4" not in smem.open_sessions("ana")
    assert (
        client.post("/users/ana/sessions/nope/end", data={"csrf_token": token}).status_code == 404
    )


def test_feedback_buttons_train_the_reranker(client, smem):
    token = csrf(client)
    r = client.post(
        "/users/ana/chat",
        data={"csrf_token": token, "session_id": "s3", "message": "Which race am I training for?"},
    )
    ex = re.search(r'<li class="exchange" id="ex-(\w+)"', r.text).group(1)
    for pos, helpful in ((0, "1"), (1, "0")):
        r = client.post(
            "/users/ana/feedback",
            data={"csrf_token": token, "exchange_id": ex, "hit": str(pos), "helpful": helpful},
        )
        assert r.status_code == 200
        assert "the turn ranker got an episode" in r.text
    assert r.text.count('class="feedback-result"') == 2
    assert "marked helpful" in r.text and "marked not helpful" in r.text
    # two episodes reached the turn ranker (scope user: the shared and ana's own offsets)
    assert smem.ranker_weights("ana")["user_episodes"] == 2
    assert smem.ranker_weights()["episodes"] >= 2
    bad = [
        ({"exchange_id": "nope", "hit": "0", "helpful": "1"}, 404),
        ({"exchange_id": ex, "hit": "99", "helpful": "1"}, 400),
        ({"exchange_id": ex, "hit": "one", "helpful": "1"}, 400),
        ({"exchange_id": ex, "hit": "0", "helpful": "maybe"}, 400),
    ]
    for data, status in bad:
        r = client.post("/users/ana/feedback", data={"csrf_token": token, **data})
        assert r.status_code == status, data


def test_delete_memory_confirms_then_deletes_and_verifies(client, smem):
    token = csrf(client)
    mid = _ids(smem, "ana")[0]
    confirm = client.get(f"/users/ana/memories/{mid}/delete")
    assert confirm.status_code == 200 and 'id="confirm-delete"' in confirm.text
    assert any(m.id == mid for m in smem.memories("ana"))  # a GET deletes nothing
    r = client.post(f"/users/ana/memories/{mid}/delete", data={"csrf_token": token})
    assert r.status_code == 200 and "Verified: it can no longer be read or retrieved" in r.text
    assert client.get(f"/users/ana/memories/{mid}").status_code == 404
    assert f"/users/ana/memories/{mid}" not in client.get("/users/ana").text


def test_delete_session_and_user(client, smem):
    token = csrf(client)
    r = client.post("/users/ana/sessions/s1/delete", data={"csrf_token": token})
    assert r.status_code == 200 and "Verified: the session is gone" in r.text
    assert client.get("/users/ana/sessions/s1").status_code == 404
    assert client.get("/users/ana/delete").status_code == 200
    r = client.post("/users/ana/delete", data={"csrf_token": token})
    assert r.status_code == 200 and "Verified: nothing of this user is left" in r.text
    assert 'data-user-id="ana"' not in r.text and 'data-user-id="bob"' in r.text
    assert client.get("/users/ana").status_code == 404
    assert smem.memories("ana") == [] and smem.turns("ana") == []


def test_stored_xss_is_rendered_as_text(client, smem):
    pages = [
        client.get("/users/ana").text,
        client.get("/users/ana/sessions/s2").text,
        client.get("/users/ana/search", params={"q": "odd snippet blog"}).text,
    ]
    token = csrf(client)
    pages.append(
        client.post(
            "/users/ana/chat",
            data={"csrf_token": token, "session_id": "x1", "message": f"odd snippet blog {XSS}"},
        ).text
    )
    for html in pages:
        assert XSS not in html
        assert "<script>document.title" not in html and "<img src=x" not in html
        assert "&lt;script&gt;document.title=&#34;pwned&#34;&lt;/script&gt;" in html


def test_static_and_api_pages(client):
    assert client.get("/static/style.css").status_code == 200
    r = client.get("/api")
    assert r.status_code == 200 and "/api/users/{user_id}/search" in r.text
    schema = client.get("/api/openapi.json").json()
    assert "/api/users/{user_id}/chat" in schema["paths"]
    assert client.get("/docs").status_code == 404  # no page that loads assets from a CDN


# ------------------------------------------------------------------ API
def test_api_reads(client, smem):
    users = client.get("/api/users").json()["users"]
    assert [u["user_id"] for u in users] == ["ana", "bob"]
    u = client.get("/api/users/ana").json()
    assert {s["session_id"] for s in u["sessions"]} == {"s1", "s2"}
    assert sum(len(v) for v in u["memories_by_kind"].values()) == len(smem.memories("ana"))
    s = client.get("/api/users/ana/sessions/s1").json()
    assert [t["turn_id"] for t in s["turns"]] == [f"s1:{i}" for i in range(4)]
    mid = s["memories"][0]["memory_id"]
    m = client.get(f"/api/users/ana/memories/{mid}").json()
    assert m["memory"]["memory_id"] == mid and m["sources"]
    r = client.get("/api/users/ana/search", params={"q": "dog name", "k": 2}).json()
    assert len(r["hits"]) == 2 and r["path"] in ("familiarity", "recollection")
    hit = r["hits"][0]
    for key in (
        "score",
        "scores",
        "path",
        "retriever_rank",
        "reranked_rank",
        "moved_up",
        "turn_ids",
        "session_id",
        "granularity",
        "date",
    ):
        assert key in hit
    assert "total" in r["timings_ms"] and r["rerank"]["scope"] == "turns"


@pytest.mark.parametrize(
    "path, status, needle",
    [
        ("/api/users/nobody", 404, "no user 'nobody'"),
        ("/api/users/ana/sessions/zz", 404, "no session 'zz'"),
        ("/api/users/ana/memories/zz", 404, "no memory 'zz'"),
        ("/api/users/ana/exchanges/zz", 404, "no reply 'zz'"),
        ("/api/users/ana/search?q=%20", 400, "must not be empty"),
        ("/api/users/ana/search", 400, "q"),
        ("/api/users/ana/search?q=x&k=-1", 400, "k must be between"),
    ],
)
def test_api_errors(client, path, status, needle):
    r = client.get(path)
    assert r.status_code == status
    body = r.json()
    assert body["status"] == status and needle in body["detail"]


def test_api_chat_feedback_and_deletes(client, smem):
    token = csrf(client)
    h = {"X-CSRF-Token": token}
    assert client.post("/api/users/ana/chat", json={"message": "hi"}).status_code == 403
    r = client.post(
        "/api/users/ana/chat",
        json={"message": "What is my dog called?", "session_id": "s9"},
        headers=h,
    )
    assert r.status_code == 200
    ex = r.json()
    assert ex["source"] == "offline" and ex["cited"] and "Pixel" in ex["reply"]
    first = ex["retrieval"]["hits"][ex["cited"][0]]
    assert first["cited"] and first["session_id"] == "s1"
    assert (
        client.get(f"/api/users/ana/exchanges/{ex['exchange_id']}").json()["reply"] == ex["reply"]
    )
    assert client.get(f"/api/users/bob/exchanges/{ex['exchange_id']}").status_code == 404
    for body in ({"message": ""}, {"message": 5}, {}, {"message": "x" * 9000}):
        assert client.post("/api/users/ana/chat", json=body, headers=h).status_code == 400
    fb = client.post(
        "/api/users/ana/feedback",
        headers=h,
        json={"exchange_id": ex["exchange_id"], "hit": 0, "helpful": True},
    )
    assert fb.status_code == 200 and fb.json()["learned"] is True
    assert fb.json()["rewards"]
    bad = client.post(
        "/api/users/ana/feedback",
        headers=h,
        json={"exchange_id": ex["exchange_id"], "hit": -1, "helpful": True},
    )
    assert bad.status_code == 400
    end = client.post("/api/users/ana/sessions/s9/end", headers=h)
    assert end.status_code == 200 and end.json()["memories"]
    mid = end.json()["memories"][0]["memory_id"]
    d = client.post(f"/api/users/ana/memories/{mid}/delete", headers=h).json()
    assert d["verified_gone"] is True
    assert client.post(f"/api/users/ana/memories/{mid}/delete", headers=h).status_code == 404
    d = client.post("/api/users/ana/sessions/s9/delete", headers=h).json()
    assert d["verified_gone"] is True and d["turns"] == 2
    d = client.post("/api/users/ana/delete", headers=h).json()
    assert d["verified_gone"] is True
    assert client.post("/api/users/ana/delete", headers=h).status_code == 404
    assert "ana" not in smem.users()


# ------------------------------------------------------------------ tokens
ADMIN = "admin-token-0123456789"
ANA = "ana-token-0123456789ab"


@pytest.fixture
def locked(smem):
    return client_for(smem, policy=AccessPolicy(ADMIN, {"ana": ANA}))


def test_token_is_required_everywhere(locked):
    for path in ("/", "/users/ana", "/api/users", "/static/style.css", "/api/openapi.json"):
        r = locked.get(path)
        assert r.status_code == 401, path
    assert (
        locked.get("/api/users", headers={"Authorization": "Bearer wrong-token-123456"}).json()[
            "detail"
        ]
        == "this access token is not valid"
    )
    assert (
        locked.post("/api/users/ana/delete", headers={"Authorization": "Bearer nope"}).status_code
        == 401
    )


def test_token_in_url_becomes_a_cookie(locked):
    r = locked.get(f"/users/ana?token={ADMIN}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/users/ana"
    assert "httponly" in r.headers["set-cookie"].lower()
    assert "samesite=strict" in r.headers["set-cookie"].lower()
    assert locked.get("/users/ana").status_code == 200  # the cookie is kept by the client
    assert locked.get("/users/bob").status_code == 200


def test_user_token_reaches_only_its_user(locked, smem):
    h = {"Authorization": f"Bearer {ANA}"}
    assert [u["user_id"] for u in locked.get("/api/users", headers=h).json()["users"]] == ["ana"]
    assert locked.get("/api/users/ana", headers=h).status_code == 200
    bob_mid = _ids(smem, "bob")[0]
    for path in (
        "/api/users/bob",
        f"/api/users/bob/memories/{bob_mid}",
        "/api/users/bob/search?q=sister",
        "/api/users/nobody",
    ):
        r = locked.get(path, headers=h)
        assert r.status_code == 403 and "no rights to user" in r.json()["detail"], path
    r = locked.post("/api/users/bob/delete", headers=h)
    assert r.status_code == 403 and "bob" in smem.users()
    # a bearer-authenticated client needs no CSRF token (browsers never send that header)
    r = locked.post("/api/users/ana/chat", headers=h, json={"message": "dog?", "session_id": "t"})
    assert r.status_code == 200


def test_user_token_page_access_and_csrf_is_per_principal(locked):
    locked.get(f"/?token={ANA}")
    assert locked.get("/users/bob").status_code == 403
    page = locked.get("/")
    assert 'data-user-id="bob"' not in page.text and 'data-user-id="ana"' in page.text
    ana_csrf = csrf(locked)
    locked.cookies.clear()
    locked.get(f"/?token={ADMIN}")
    admin_csrf = csrf(locked)
    assert ana_csrf != admin_csrf
    r = locked.post("/users/ana/sessions/new", data={"csrf_token": ana_csrf})
    assert r.status_code == 403  # another principal's CSRF token does not work


def test_host_header_is_checked_for_an_open_loopback_app(smem):
    c = client_for(smem, allowed_hosts=["127.0.0.1", "localhost"])
    assert c.get("/", headers={"host": "127.0.0.1:8765"}).status_code == 200
    assert c.get("/", headers={"host": "localhost"}).status_code == 200
    r = c.get("/", headers={"host": "evil.example:8765"})
    assert r.status_code == 400 and "Host" in r.json()["detail"]


def test_chat_form_value_round_trip(client):
    page = client.get("/users/ana/chat?session=s1")
    assert form_value(page.text, "session_id") == "s1"


def test_chat_with_an_llm_shows_its_citations_cost_and_training(smem):
    from reflective_memory.serve.answer import LLMAnswerer

    from tests.fakes import Scripted

    llm = Scripted("Your beagle is called Pixel. [0]")
    client = client_for(smem, answerer=LLMAnswerer(llm))
    token = csrf(client)
    r = client.post(
        "/users/ana/chat",
        data={"csrf_token": token, "session_id": "s5", "message": "What is my dog called?"},
    )
    assert r.status_code == 200
    assert '<span class="src llm">LLM</span>' in r.text
    assert "Your beagle is called Pixel." in r.text
    assert "LLM 1 call(s)" in r.text
    assert "The reply's citations trained the reranker: " in r.text
    assert "not learned" not in r.text and "answers: Scripted" in r.text
    assert "=== Memory [0] ===" in llm.prompts[0]
    broken = client_for(smem, answerer=LLMAnswerer(Scripted(RuntimeError("quota exceeded"))))
    r = broken.post(
        "/users/ana/chat",
        data={"csrf_token": csrf(broken), "session_id": "s6", "message": "What is my dog called?"},
    )
    assert r.status_code == 200 and "replaced by the offline answer" in r.text
    assert "quota exceeded" in r.text and "offline extractive" in r.text


def test_user_page_and_api_show_the_turn_rankers_weights_next_to_the_prior(client, smem):
    r = smem.retrieve("ana", "what dog do I have", budget_tokens=200)
    cited = smem.feedback(r, cited=[0]) if len(r.hits) > 1 else None
    page = client.get("/users/ana")
    assert page.status_code == 200 and 'id="ranker"' in page.text and "cosine" in page.text
    ranker = client.get("/api/users/ana").json()["ranker"]
    rows = {row["feature"]: row for row in ranker["rows"]}
    assert "cosine" in rows and rows["cosine"]["prior"] != 0
    on = [ranker["shared_serves"], ranker["user_serves"]]
    for row in rows.values():  # what each gate lets rank (one episode passes none)
        taught = row["shared"] * on[0] + row["user"] * on[1]
        assert row["weight"] == pytest.approx(row["prior"] + taught, abs=2e-4)
    assert "is held back" in page.text
    want = smem.ranker_weights("ana")
    assert ranker["shared_t"] == round(want["shared_gate"]["t"], 2) and ranker["gate_t"] == 2.5
    assert f"({want['user_gate']['t']:+.2f} standard errors)" in page.text
    assert "by more than 2.5 standard errors" in page.text
    if cited is not None and cited.learned:
        assert ranker["user_episodes"] == 1 and any(row["user"] for row in rows.values())
