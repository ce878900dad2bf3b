"""End to end in a real headless Chromium: chat, recall across sessions, feedback, delete, XSS.

Needs Debian's `chromium` and `chromium-driver` (`.ci/install-browser.sh`) and selenium. Skips
with the reason when they are missing; fails instead when REFLECTIVE_REQUIRE_BROWSER=1.
Screenshots go to REFLECTIVE_SCREENSHOTS (a directory) if set, else to the test's tmp dir.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def _find(env: str, name: str) -> str | None:
    """The executable from `env` if set (tests of the skip path set a bad one), else Debian's."""
    given = os.environ.get(env)
    for path in [given] if given else [f"/usr/bin/{name}", shutil.which(name) or ""]:
        if path and Path(path).is_file():
            return path
    return None


CHROMIUM = _find("REFLECTIVE_CHROMIUM", "chromium")
CHROMEDRIVER = _find("REFLECTIVE_CHROMEDRIVER", "chromedriver")
REQUIRED = os.environ.get("REFLECTIVE_REQUIRE_BROWSER") == "1"


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return f"selenium/uvicorn not installed ({exc}); pip install -e '.[all]'"
    if CHROMIUM is None or CHROMEDRIVER is None:
        return "chromium or chromedriver not found; run .ci/install-browser.sh (Debian packages)"
    return None


@pytest.fixture(scope="module")
def browser_ready():
    reason = _missing()
    if reason is not None:
        if REQUIRED:
            pytest.fail(f"REFLECTIVE_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture
def live_server(browser_ready, tmp_path):
    from reflective_memory import HashingEmbedder, ReflectiveMemory
    from reflective_memory.serve.app import create_app
    from serve_helpers import live_server as serve

    mem = ReflectiveMemory(tmp_path / "db", embedder=HashingEmbedder(dim=256))
    app = create_app(mem, allowed_hosts=["127.0.0.1", "localhost"])
    try:
        with serve(app) as port:
            yield f"http://127.0.0.1:{port}", mem
    finally:
        mem.close()


@pytest.fixture
def driver(browser_ready, tmp_path, monkeypatch):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager must never download
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    drv.set_page_load_timeout(60)
    try:
        yield drv
    finally:
        drv.quit()


def _shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("REFLECTIVE_SCREENSHOTS") or tmp_path / "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


XSS = (
    "My blog header is <script>document.title='pwned'</script>"
    "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\"> keep it"
)


def test_chat_recall_feedback_delete_and_xss(live_server, driver, tmp_path):
    from selenium.common.exceptions import NoAlertPresentException, WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    base, mem = live_server
    shots = _shots(tmp_path)
    wait = WebDriverWait(driver, 60)
    # Scripts run while a page navigates may fail transiently; the load wait retries them.
    load_wait = WebDriverWait(driver, 60, ignored_exceptions=(WebDriverException,))

    def submit(button_css: str) -> None:
        # Mark the current document, click, then wait for a fully loaded document without the
        # mark. (Polling a stale element instead races Chromium's navigation: the driver can
        # answer "node does not belong to the document" rather than "stale element".)
        driver.execute_script("window.__before_submit = true;")
        driver.find_element(By.CSS_SELECTOR, button_css).click()
        load_wait.until(
            lambda d: d.execute_script(
                "return !window.__before_submit && document.readyState === 'complete';"
            )
        )

    def send(text: str) -> None:
        box = driver.find_element(By.ID, "message")
        box.clear()
        box.send_keys(text)
        submit("#send")

    # Open a chat as a new user from the users page.
    driver.get(base + "/")
    driver.find_element(By.NAME, "user").send_keys("ana")
    submit("#open-chat")
    assert "/users/ana/chat?session=chat-" in driver.current_url
    first_session = driver.find_element(By.ID, "session-id").text

    # Session 1: a fact, and a stored XSS payload.
    send("I adopted a beagle puppy called Pixel last weekend.")
    send(XSS)
    bubbles = driver.find_elements(By.CSS_SELECTOR, "li.role-user .bubble")
    assert bubbles[-1].text == XSS  # shown as text, exactly as typed
    driver.save_screenshot(str(shots / "1-session-one.png"))

    # A new session ends session 1: it becomes memories.
    submit("#new-session")
    assert "Ended 1 session(s)" in driver.find_element(By.ID, "notice").text
    assert driver.find_element(By.ID, "session-id").text != first_session
    assert mem.open_sessions("ana") == []

    # Session 2: the fact from session 1 is recalled, with its path and citation.
    send("What is my dog called?")
    exchange = driver.find_elements(By.CSS_SELECTOR, "li.exchange")[-1]
    reply = driver.find_elements(By.CSS_SELECTOR, "li.role-assistant .bubble")[-1].text
    assert "Pixel" in reply
    cited = exchange.find_elements(By.CSS_SELECTOR, "li.hit.is-cited")
    assert cited, "the reply cites a memory"
    hit = cited[0]
    assert "Pixel" in hit.find_element(By.CSS_SELECTOR, "pre.memtext").text
    assert hit.find_element(By.CSS_SELECTOR, ".hit-path").text in ("familiarity", "recollection")
    assert hit.find_element(By.CSS_SELECTOR, ".hit-cited").text == "cited"
    prov = hit.find_element(By.CSS_SELECTOR, ".prov a").get_attribute("href")
    assert prov.endswith(f"/users/ana/sessions/{first_session}")
    assert exchange.find_element(By.CSS_SELECTOR, ".ex-cited").text.startswith("[")
    driver.save_screenshot(str(shots / "2-recalled-with-citation.png"))

    # Feedback: mark the cited memory helpful; the reranker gets an episode.
    hit_id = hit.get_attribute("id")
    submit(f"#{hit_id} button.mark-helpful")
    assert "the turn ranker got an episode" in driver.find_element(By.ID, "notice").text
    assert driver.find_elements(By.CSS_SELECTOR, ".feedback-result")
    marked = driver.find_element(By.ID, hit_id)
    assert "marked helpful" in marked.text
    driver.save_screenshot(str(shots / "3-feedback.png"))

    # The XSS payload stayed inert on every page that shows it.
    memory_id = marked.get_attribute("data-memory-id")
    for path in ("/users/ana", f"/users/ana/sessions/{first_session}"):
        driver.get(base + path)
        assert "<script>document.title='pwned'</script>" in driver.page_source.replace(
            "&lt;", "<"
        ).replace("&gt;", ">")
        assert "pwned" not in driver.title
        assert driver.find_element(By.TAG_NAME, "body").get_attribute("data-pwned") is None
        assert not driver.find_elements(By.CSS_SELECTOR, "main img")
        with pytest.raises(NoAlertPresentException):
            driver.switch_to.alert.text  # noqa: B018
    driver.save_screenshot(str(shots / "4-user-page.png"))

    # Delete the user (with confirmation) and see the memory gone.
    driver.get(base + "/users/ana")
    driver.find_element(By.ID, "delete-user").click()
    wait.until(ec.presence_of_element_located((By.ID, "confirm-delete")))
    submit("#confirm-delete")
    notice = driver.find_element(By.ID, "notice").text
    assert "Deleted user ana" in notice and "Verified" in notice
    assert not driver.find_elements(By.CSS_SELECTOR, 'tr[data-user-id="ana"]')
    driver.save_screenshot(str(shots / "5-deleted.png"))
    driver.get(f"{base}/users/ana/memories/{memory_id}")
    assert driver.find_element(By.ID, "error-message").text.startswith("no user 'ana'")
    assert mem.memories("ana") == [] and mem.turns("ana") == []
    for name in ("1-session-one", "2-recalled-with-citation", "3-feedback", "5-deleted"):
        assert (shots / f"{name}.png").stat().st_size > 5000
