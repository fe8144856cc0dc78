"""stickless over `rediss://` with ACL users restricted to a namespace: the demo scenes and a
`stickless serve` node run over TLS (the server's certificate checked against the run's CA),
and a user without the key or channel pattern, or with a wrong password, gets a clear startup
error naming the rule it needs."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pytest

from stickless import DeploymentMode, RouterConfig, SessionRouter, StoreMisconfiguredError
from stickless.backends.redis import Keys, RedisBackends
from stickless.backends.redis._server import acl_rule
from stickless.cli import main

from .agents import Journal, ScriptedOpener
from .redis_tls import PASSWORD, TlsRedis, tls_redis
from .test_cli import _check_demo_output
from .test_web_cluster import AGENT, WAIT

__all__ = ["tls_redis"]


def test_the_demo_scenes_pass_over_tls_with_a_namespace_restricted_user(
    tls_redis: TlsRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    # redis-py reads the CA file from the URL's query as well
    url = f"{tls_redis.url('demo')}?ssl_ca_certs={tls_redis.ca}"
    code = main(["demo", "--redis", url, "--timeout", "50"])
    out = capsys.readouterr().out
    assert code == 0, out
    _check_demo_output(out)


@pytest.mark.parametrize("name", ["nokeys", "nochannels", "noinfo"])
async def test_a_user_without_the_namespace_patterns_gets_a_clear_startup_error(
    tls_redis: TlsRedis, name: str
) -> None:
    backends = RedisBackends.from_url(
        tls_redis.url(name), namespace="tlsns", ssl_ca_certs=str(tls_redis.ca)
    )
    router = SessionRouter.build(
        config=RouterConfig(node_id="acl", mode=DeploymentMode.DISTRIBUTED),
        opener=ScriptedOpener(Journal()),
        backends=backends,
    )
    try:
        with pytest.raises(StoreMisconfiguredError) as refused:
            await router.start()
        message = str(refused.value)
        assert "NoPermissionError" in message
        assert f"`{acl_rule(Keys('tlsns'))}`" in message
        assert "~tlsns:* ~{tlsns:s:* &tlsns:*" in message
        assert not router.accepting
    finally:
        await router.aclose(grace=0)
        await backends.aclose()


async def test_a_wrong_password_is_a_startup_error(tls_redis: TlsRedis) -> None:
    url = tls_redis.url("stickless").replace(PASSWORD, "wrong")
    backends = RedisBackends.from_url(url, namespace="tlsns", ssl_ca_certs=str(tls_redis.ca))
    try:
        with pytest.raises(StoreMisconfiguredError, match="AuthenticationError"):
            await backends.verify()
    finally:
        await backends.aclose()


def test_a_ca_file_needs_a_tls_url_and_a_readable_file(tls_redis: TlsRedis) -> None:
    with pytest.raises(ValueError, match="needs a rediss:// URL"):
        RedisBackends.from_url("redis://127.0.0.1:1/0", ssl_ca_certs=str(tls_redis.ca))
    with pytest.raises(ValueError, match="is not a readable file"):
        RedisBackends.from_url(tls_redis.url("stickless"), ssl_ca_certs="/nonexistent/ca.pem")


def test_serve_runs_turns_over_tls_as_the_namespace_user(tls_redis: TlsRedis) -> None:
    args = [
        sys.executable, "-m", "stickless", "serve", "--port", "0", "--namespace", "tlsns",
        "--redis", tls_redis.url("stickless"), "--redis-ca", str(tls_redis.ca),
    ]  # fmt: skip
    node = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert node.stdout is not None
        ready = node.stdout.readline().split()
        assert ready[:1] == ["READY"], node.stderr.read() if node.stderr else ready
        base = f"http://127.0.0.1:{ready[1]}/v1/sessions/tls-1/turns"
        body = {"agent_ref": AGENT, "input": "over tls"}
        accepted = httpx.post(base, json=body, timeout=30)
        assert accepted.status_code == 202, accepted.text
        turn_id = accepted.json()["turn_id"]
        done = httpx.get(f"{base}/{turn_id}", params={"wait": WAIT}, timeout=WAIT + 5).json()
        assert done["state"] == "completed", done
        assert re.search("over tls", str(done["result"])), done
    finally:
        node.terminate()
        node.communicate(timeout=30)
    assert node.returncode == 0


def test_the_readme_shows_the_acl_rule_a_node_asks_for() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    shown = f"ACL SETUSER stickless on >PASSWORD {acl_rule(Keys('stickless'))}"
    assert shown in readme
