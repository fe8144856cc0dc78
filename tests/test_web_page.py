"""The chat page across reloads and tabs, in a real headless Chromium through haproxy over three
`stickless serve` nodes: the session in the URL, history and a running turn rejoined after a
reload (also after the holder was SIGKILLed), a second tab following live, double-texting with a
priority (a NOW message joining the running turn), the token field, markdown and the ids kept in a
detail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from stickless.demo.agent import STORY

from .redis_fixture import RedisServer
from .test_web_browser import (
    POLL,
    WAIT,
    _meta,
    _open,
    _send,
    _state,
    _text,
    _wait_end,
    _wait_words,
    driver,
    web,
)
from .web_cluster import WebCluster

__all__ = ["driver", "web"]  # fixtures, used here


def _turns(driver: WebDriver) -> list[tuple[str, str, str]]:
    """(turn id, user text, assistant text) of every turn shown, in order."""
    shown = []
    for turn in driver.find_elements(By.CSS_SELECTOR, "#log .turn"):
        user = turn.find_element(By.CSS_SELECTOR, ".user").get_attribute("textContent") or ""
        shown.append((turn.get_attribute("data-turn-id") or "", user.strip(), _text(turn).strip()))
    return shown


def _options(driver: WebDriver, options: str) -> None:
    """Set the turn options (JSON) of the next sends; the field sits in a closed detail."""
    driver.execute_script("document.getElementById('options').value = arguments[0]", options)


def _turn(driver: WebDriver, turn_id: str) -> object:
    """The element of `turn_id`, once the page shows it."""
    return WebDriverWait(driver, WAIT, poll_frequency=POLL).until(
        lambda d: next(
            iter(d.find_elements(By.CSS_SELECTOR, f'.turn[data-turn-id="{turn_id}"]')), False
        )
    )


def test_session_in_url_history_and_reload_mid_stream(driver: WebDriver, web: WebCluster) -> None:
    session = _open(driver, web, {"delay": 0.1})
    assert parse_qs(urlparse(driver.current_url).query)["session"] == [session]
    first = _send(driver, "hello")
    assert _wait_end(driver, first) == "completed"
    first_id = first.get_attribute("data-turn-id") or ""
    _options(driver, '{"delay": 0.1, "story": true}')
    story = _send(driver, "a story")
    story_id = story.get_attribute("data-turn-id")
    _wait_words(driver, story, 5)
    driver.refresh()  # mid-stream: the page must find the turn again and continue it
    rejoined = _turn(driver, story_id)
    assert driver.find_element(By.ID, "session").text == session
    assert _wait_end(driver, rejoined) == "completed"
    # Every word once, in order: the replayed start and the live rest met without a gap.
    assert _text(rejoined).split() == STORY.split()
    assert _turns(driver) == [
        (first_id, "hello", "you said 'hello'; this handle has now run 1 turn(s)"),
        (story_id, "a story", STORY),
    ]


def test_second_tab_follows_live(driver: WebDriver, web: WebCluster) -> None:
    session = _open(driver, web, {"delay": 0.05})
    one = _send(driver, "one")
    assert _wait_end(driver, one) == "completed"
    one_id = one.get_attribute("data-turn-id") or ""
    first_tab = driver.current_window_handle
    driver.switch_to.new_window("tab")
    try:
        _open(driver, web, {"delay": 0.05}, session=session)
        _turn(driver, one_id)  # the history
        two = _send(driver, "two")
        two_id = two.get_attribute("data-turn-id") or ""
        assert _wait_end(driver, two) == "completed"
        driver.switch_to.window(first_tab)
        seen = _turn(driver, two_id)
        assert _wait_end(driver, seen) == "completed"  # type: ignore[arg-type]
        WebDriverWait(driver, WAIT, poll_frequency=POLL).until(
            lambda d: _turns(d)[-1][1] == "two"  # the user's text, once committed
        )
        three = _send(driver, "three")
        assert _wait_end(driver, three) == "completed"
        three_id = three.get_attribute("data-turn-id") or ""
        second_tab = next(h for h in driver.window_handles if h != first_tab)
        driver.switch_to.window(second_tab)
        followed = _turn(driver, three_id)
        assert _wait_end(driver, followed) == "completed"  # type: ignore[arg-type]
        expected = [
            ("one", "you said 'one'; this handle has now run 1 turn(s)"),
            ("two", "you said 'two'; this handle has now run 2 turn(s)"),
            ("three", "you said 'three'; this handle has now run 3 turn(s)"),
        ]
        WebDriverWait(driver, WAIT, poll_frequency=POLL).until(
            lambda d: [t[1:] for t in _turns(d)] == expected
        )
        driver.close()
    finally:
        driver.switch_to.window(first_tab)
    assert [t[1:] for t in _turns(driver)] == expected


def test_double_texting_queues_with_a_priority(driver: WebDriver, web: WebCluster) -> None:
    _open(driver, web, {"delay": 0.1, "story": True})
    story = _send(driver, "story")
    _wait_words(driver, story, 2)
    choice = driver.find_element(By.ID, "queue-choice")
    assert choice.is_displayed()
    _options(driver, "")
    queued = {}
    for priority, message in (("LATER", "after"), ("NEXT", "next")):
        driver.find_element(By.CSS_SELECTOR, f'#priority option[value="{priority}"]').click()
        # Send and Enter both work while a turn runs.
        queued[message] = _send(driver, message, by_enter=message == "next")
        assert _state(queued[message]) in ("queued", "sending")
    assert _wait_end(driver, story) == "completed"
    assert _wait_end(driver, queued["after"]) == "completed"
    assert _wait_end(driver, queued["next"]) == "completed"
    # NEXT went before LATER, though sent after it.
    assert _text(queued["next"]).strip() == "you said 'next'; this handle has now run 2 turn(s)"
    assert _text(queued["after"]).strip() == "you said 'after'; this handle has now run 3 turn(s)"
    assert not choice.is_displayed()


def test_now_joins_the_running_turn(driver: WebDriver, web: WebCluster) -> None:
    session = _open(driver, web, {"delay": 0.1, "story": True})
    story = _send(driver, "story")
    story_id = story.get_attribute("data-turn-id") or ""
    _wait_words(driver, story, 2)
    _options(driver, "")
    driver.find_element(By.CSS_SELECTOR, '#priority option[value="NOW"]').click()
    now = _send(driver, "hurry")
    assert _wait_end(driver, story) == "completed"
    assert _wait_end(driver, now) == "completed"
    # The running turn heard it (the demo agent says so in its reply) and the message shows the
    # answer of the turn it joined, marked as joined; no turn of its own ran.
    said = _text(story).split()
    assert "(you also said 'hurry')" in " ".join(said)
    assert " ".join(said).replace("(you also said 'hurry') ", "").split() == STORY.split()
    assert now.find_element(By.CSS_SELECTOR, ".state").text == "completed (joined the running turn)"
    assert _text(now).split() == said
    now_id = now.get_attribute("data-turn-id") or ""
    assert [t[:2] for t in _turns(driver)] == [(story_id, "story"), (now_id, "hurry")]
    entries = httpx.get(f"{web.url}/v1/sessions/{session}/transcript", timeout=WAIT).json()
    assert [(e["role"], e["content"], e["turn_id"]) for e in entries["entries"]] == [
        ("user", "story", story_id),
        ("user", "hurry", story_id),
        ("assistant", " ".join(said), story_id),
    ]


def test_markdown_is_rendered_safely_and_ids_sit_in_a_detail(
    driver: WebDriver, web: WebCluster
) -> None:
    reply = (
        "Some **bold** and `code` <img src=x onerror=alert(1)> "
        "[docs](https://example.com/docs) [bad](javascript:void0)"
    )
    _open(driver, web, {"delay": 0.01, "story": reply})
    turn = _send(driver, "markdown")
    assert _wait_end(driver, turn) == "completed"
    text = turn.find_element(By.CSS_SELECTOR, ".text")
    assert text.find_element(By.TAG_NAME, "strong").text == "bold"
    assert text.find_element(By.TAG_NAME, "code").text == "code"
    assert text.find_elements(By.TAG_NAME, "img") == []
    assert "<img src=x onerror=alert(1)>" in text.text
    # A link only to a safe address; any other stays text.
    (link,) = text.find_elements(By.TAG_NAME, "a")
    assert (link.text, link.get_attribute("href")) == ("docs", "https://example.com/docs")
    assert "[bad](javascript:void0)" in text.text
    # The main line shows the state; the ids only once the detail is opened.
    turn_id = turn.get_attribute("data-turn-id") or ""
    assert turn_id not in turn.text
    turn.find_element(By.CSS_SELECTOR, ".ids summary").click()
    assert turn_id in turn.text and _meta(turn, "executed-by")


def test_holder_killed_mid_stream_then_reload(driver: WebDriver, web: WebCluster) -> None:
    _open(driver, web, {"delay": 0.1, "story": True})
    turn = _send(driver, "story")
    turn_id = turn.get_attribute("data-turn-id")
    _wait_words(driver, turn, 4)
    holder = web.node_named(_meta(turn, "executed-by"))
    holder.sigkill()
    try:
        state = _wait_end(driver, turn)
        words = _text(turn).split()
        driver.refresh()
        again = _turn(driver, turn_id or "")
        assert _wait_end(driver, again) == state  # type: ignore[arg-type]
        # What the page shows is the log's: no word twice, none out of order.
        shown = _text(again).split()  # type: ignore[arg-type]
        assert shown == STORY.split()[: len(shown)] and len(shown) >= len(words)
        _options(driver, "")
        after = _send(driver, "after")
        assert _wait_end(driver, after) == "completed"
    finally:
        holder.start()
        web.balancer.wait_serving(len(web.nodes))


@pytest.fixture(scope="module")
def token_web(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebCluster]:
    """One serve node with bearer tokens, behind haproxy."""
    redis_server.start()
    with WebCluster(
        redis_server.url,
        tmp_path_factory.mktemp("web-tokens"),
        nodes=1,
        tokens={"page-token": "alice"},
    ) as cluster:
        yield cluster


def test_token_field_when_the_server_needs_one(
    driver: WebDriver, token_web: WebCluster, tmp_path: Path
) -> None:
    driver.get(f"{token_web.url}/?session=chat-tokens-{tmp_path.name[-8:]}")
    auth = driver.find_element(By.ID, "auth")
    box = driver.find_element(By.ID, "input")
    box.send_keys("hello")
    driver.find_element(By.ID, "send").click()
    WebDriverWait(driver, WAIT, poll_frequency=POLL).until(lambda _: auth.is_displayed())
    driver.find_element(By.ID, "token").send_keys("page-token")
    driver.find_element(By.ID, "use-token").click()
    assert not auth.is_displayed()
    turn = _send(driver, "with a token")
    assert _wait_end(driver, turn) == "completed"
    turn_id = turn.get_attribute("data-turn-id") or ""
    driver.refresh()  # the token is kept for the tab: the history loads with it
    _turn(driver, turn_id)
    assert not driver.find_element(By.ID, "auth").is_displayed()
    assert driver.execute_script("return sessionStorage.getItem('stickless.token')") == "page-token"
