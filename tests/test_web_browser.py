"""The chat page in a real headless Chromium, through haproxy over three `stickless serve`
nodes: streamed text, Stop, and the page's own resume after a dropped stream.

Needs Debian's chromium and chromedriver (never downloaded: the driver path is always given,
so Selenium Manager does not run); under CI=true a missing one fails the test, else it skips.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from stickless.demo.agent import STORY

from .redis_fixture import RedisServer
from .web_cluster import WebCluster, _require

#: Seconds any one wait in the page may take.
WAIT = 20.0
POLL = 0.05
TERMINAL = ("completed", "interrupted", "failed", "rejected")


@pytest.fixture(scope="module")
def web(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebCluster]:
    """Three serve nodes behind haproxy, shared by this module's tests (each test opens the
    page afresh, so each has its own session)."""
    redis_server.start()
    with WebCluster(redis_server.url, tmp_path_factory.mktemp("web"), nodes=3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    chromium = _require("chromium")
    chromedriver = _require("chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1100,900",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        browser.set_page_load_timeout(WAIT)
        yield browser
    finally:
        browser.quit()


def _open(
    driver: WebDriver,
    web: WebCluster,
    options: dict[str, Any] | None = None,
    session: str | None = None,
) -> str:
    """Load the chat page through the balancer (on `session`, else a new one); its session id."""
    query = {"options": json.dumps(options)} if options is not None else {}
    if session is not None:
        query["session"] = session
    url = f"{web.url}/?" + "&".join(f"{k}={quote(v)}" for k, v in query.items())
    driver.get(url)
    session = WebDriverWait(driver, WAIT).until(
        lambda d: d.find_element(By.ID, "session").text.strip() or False
    )
    assert isinstance(session, str)
    return session


def _send(driver: WebDriver, message: str, by_enter: bool = False) -> WebElement:
    """Type and send a message (with Send, or the Enter key); the new turn's element once the
    turn has its id."""
    before = len(driver.find_elements(By.CSS_SELECTOR, "#log .turn"))
    box = driver.find_element(By.ID, "input")
    box.clear()
    if by_enter:
        box.send_keys(message + Keys.ENTER)
    else:
        box.send_keys(message)
        WebDriverWait(driver, WAIT).until(ec.element_to_be_clickable((By.ID, "send"))).click()

    def turn_with_id(d: WebDriver) -> WebElement | bool:
        turns = d.find_elements(By.CSS_SELECTOR, "#log .turn")
        if len(turns) <= before:
            return False
        turn = turns[-1]
        return turn if turn.get_attribute("data-turn-id") else False

    found = WebDriverWait(driver, WAIT, poll_frequency=POLL).until(turn_with_id)
    assert isinstance(found, WebElement)
    return found


def _text(turn: WebElement) -> str:
    return turn.find_element(By.CSS_SELECTOR, ".text").get_attribute("textContent") or ""


def _state(turn: WebElement) -> str:
    return turn.get_attribute("data-state") or ""


def _wait_words(driver: WebDriver, turn: WebElement, at_least: int) -> None:
    WebDriverWait(driver, WAIT, poll_frequency=POLL).until(
        lambda _: len(_text(turn).split()) >= at_least
    )


def _wait_end(driver: WebDriver, turn: WebElement, seen: list[str] | None = None) -> str:
    """Wait for the turn's terminal state (recording each different text seen on the way)."""

    def ended(_: WebDriver) -> str | bool:
        if seen is not None:
            text = _text(turn)
            if text and (not seen or seen[-1] != text):
                seen.append(text)
        state = _state(turn)
        return state if state in TERMINAL else False

    state = WebDriverWait(driver, WAIT, poll_frequency=POLL).until(ended)
    assert isinstance(state, str)
    return state


def _result_text(web: WebCluster, session: str, turn_id: str) -> str:
    answer = httpx.get(f"{web.url}/v1/sessions/{session}/turns/{turn_id}?wait=30", timeout=40)
    assert answer.status_code == 200, answer.text
    view = answer.json()
    assert view["state"] == "completed", view
    text = view["result"]["text"]
    assert isinstance(text, str)
    return text


def _nodes(web: WebCluster) -> set[str]:
    return {node.node_id for node in web.nodes}


def _meta(turn: WebElement, name: str) -> str:
    # textContent: the ids sit in a closed <details>, which .text does not read.
    found = turn.find_element(By.CSS_SELECTOR, f".{name}").get_attribute("textContent")
    return (found or "").strip()


def _shot(driver: WebDriver, path: Path) -> None:
    assert driver.save_screenshot(str(path)), path
    assert path.stat().st_size > 0


def test_page_is_self_contained(web: WebCluster) -> None:
    page = httpx.get(f"{web.url}/", timeout=10)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert 'id="send"' in page.text
    # No CDN, no outside script, style, font or image: everything is inline.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page.text)
    assert "@import" not in page.text


def test_streams_a_reply(driver: WebDriver, web: WebCluster, tmp_path: Path) -> None:
    session = _open(driver, web, {"delay": 0.15})
    assert session.startswith("chat-")
    turn = _send(driver, "hello")
    turn_id = turn.get_attribute("data-turn-id")
    assert turn_id
    seen: list[str] = []
    state = _wait_end(driver, turn, seen)
    _shot(driver, tmp_path / "streamed.png")
    assert state == "completed", _meta(turn, "state")
    expected = "you said 'hello'; this handle has now run 1 turn(s)"
    assert _text(turn).strip() == expected
    assert _text(turn).strip() == _result_text(web, session, turn_id)
    # The text arrived word by word: several growing prefixes before the end.
    partial = [text for text in seen if text.strip() != expected]
    assert len(partial) >= 3, seen
    assert all(expected.startswith(text.strip()) for text in seen), seen
    assert [len(t) for t in seen] == sorted(len(t) for t in seen), seen
    assert _meta(turn, "accepted-by") in _nodes(web)
    assert _meta(turn, "executed-by") in _nodes(web)
    assert _meta(turn, "state") == "completed"
    body = driver.find_element(By.TAG_NAME, "body").text
    assert expected in body and session in body
    assert turn.get_attribute("data-reconnects") == "0"
    # The Stop button is off again once the turn is over; Send is back on.
    assert not driver.find_element(By.ID, "stop").is_enabled()
    assert driver.find_element(By.ID, "send").is_enabled()


def test_stop_interrupts_a_long_turn(driver: WebDriver, web: WebCluster, tmp_path: Path) -> None:
    session = _open(driver, web, {"delay": 0.2, "story": True})
    turn = _send(driver, "tell me a story")
    _wait_words(driver, turn, 3)
    WebDriverWait(driver, WAIT).until(ec.element_to_be_clickable((By.ID, "stop"))).click()
    started = time.monotonic()
    state = _wait_end(driver, turn)
    _shot(driver, tmp_path / "stopped.png")
    assert state == "interrupted", _meta(turn, "state")
    assert time.monotonic() - started < 10
    assert _meta(turn, "state").startswith("interrupted")
    text = _text(turn).strip()
    assert STORY.startswith(text) and len(text.split()) < len(STORY.split())
    assert _meta(turn, "executed-by") in _nodes(web)
    assert _meta(turn, "accepted-by") in _nodes(web)
    assert not driver.find_element(By.ID, "stop").is_enabled()
    # The session takes the next turn right away.
    assert session == driver.find_element(By.ID, "session").text.strip()


def test_resumes_after_a_dropped_stream(driver: WebDriver, web: WebCluster, tmp_path: Path) -> None:
    session = _open(driver, web, {"delay": 0.08, "story": True})
    turn = _send(driver, "a story, please")
    turn_id = turn.get_attribute("data-turn-id")
    assert turn_id
    total = len(STORY.split())
    _wait_words(driver, turn, 5)
    assert driver.execute_script("return window.sticklessChat.dropConnection()") is True
    WebDriverWait(driver, WAIT, poll_frequency=POLL).until(
        lambda _: int(turn.get_attribute("data-reconnects") or 0) >= 1
    )
    # Drop the resumed stream too, once it has brought more words.
    _wait_words(driver, turn, min(total - 5, len(_text(turn).split()) + 5))
    dropped_again = driver.execute_script("return window.sticklessChat.dropConnection()")
    state = _wait_end(driver, turn)
    _shot(driver, tmp_path / "resumed.png")
    assert state == "completed", _meta(turn, "state")
    reconnects = int(turn.get_attribute("data-reconnects") or 0)
    assert reconnects >= (2 if dropped_again else 1)
    result = _result_text(web, session, turn_id)
    assert result == STORY
    text = _text(turn)
    # Every word once, in order: no frame replayed on resume was shown twice.
    assert text.strip() == result
    assert text.split() == STORY.split()
    assert _meta(turn, "reconnect-count") == str(reconnects)
    assert _meta(turn, "executed-by") in _nodes(web)


def test_turns_accepted_anywhere_run_on_the_holder(
    driver: WebDriver, web: WebCluster, tmp_path: Path
) -> None:
    """Round robin spreads the submits over the nodes; every turn runs on the session's one
    holder, whose handle counts them."""
    _open(driver, web)
    turns = []
    for n in range(1, 4):
        turn = _send(driver, f"message {n}")
        assert _wait_end(driver, turn) == "completed", _meta(turn, "state")
        assert _text(turn).strip() == f"you said 'message {n}'; this handle has now run {n} turn(s)"
        turns.append(turn)
    _shot(driver, tmp_path / "three-turns.png")
    accepted = [_meta(turn, "accepted-by") for turn in turns]
    executed = {_meta(turn, "executed-by") for turn in turns}
    assert set(accepted) <= _nodes(web) and len(set(accepted)) >= 2, accepted
    assert len(executed) == 1 and executed <= _nodes(web), executed
    assert any(node not in executed for node in accepted), (accepted, executed)
    assert len({turn.get_attribute("data-turn-id") for turn in turns}) == 3
