"""Real `stickless serve` processes over one redis-server behind a real haproxy (or nginx)
doing round robin with no stickiness, all on loopback; every process is stopped by its pid.

The balancer runs the deployment guide's own file (deploy/haproxy.cfg, deploy/nginx.conf) with
only its listen address and server lines replaced by the test's ports.

`WebCluster` is synchronous (the HTTP tests drive it with blocking clients and a browser);
`haproxy_executable()` / `nginx_executable()` fail under CI=true and skip otherwise when the
balancer is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from stickless.local_services import free_port

from .mp_cluster import LIVE_PROCESSES, REPO_ROOT, START_TIMEOUT, STOP_TIMEOUT

#: Router timings of the web nodes: short, so a killed holder is found quickly.
WEB_CONFIG: dict[str, Any] = {
    "lease_ttl": 2.0,
    "lease_extend_interval": 0.5,
    "holder_loss_sweep_interval": 0.5,
    "status_heartbeat_interval": 0.5,
    "forward_ttl": 20.0,
    "interrupt_grace": 1.0,
    "release_interrupt_timeout": 2.0,
}


def _require(name: str) -> str:
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if found is not None:
        return found
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{name} is not installed but CI=true requires it (apt-get install -y {name})")
    pytest.skip(f"{name} is not installed")


def haproxy_executable() -> str:
    return _require("haproxy")


def nginx_executable() -> str:
    return _require("nginx")


#: The deployment guide's balancer configs, as the README shows them.
DEPLOY = REPO_ROOT / "deploy"
#: The listen line and the server lines of a deploy config (haproxy `bind`, nginx `listen`;
#: `server web-N 127.0.0.1:PORT ...` / `server 127.0.0.1:PORT ...`).
_LISTEN = re.compile(r"(\s*(?:bind|listen) )127\.0\.0\.1:8000(;?)")
_SERVER = re.compile(r"(\s*server (?:web-1 |web-\d+ )?)127\.0\.0\.1:800[1-9]( .*)?")


def render_config(path: Path, port: int, nodes: list[WebNode]) -> str:
    """The deploy config at `path`, listening on `port` with one server line per node (each
    with the options of the file's first server line): everything else as the file says."""
    lines: list[str] = []
    listens = servers = 0
    for line in path.read_text().splitlines():
        listen, server = _LISTEN.fullmatch(line), _SERVER.fullmatch(line)
        if listen is not None:
            listens += 1
            lines.append(f"{listen[1]}127.0.0.1:{port}{listen[2]}")
        elif server is not None:
            servers += 1
            head, options = re.sub(r"web-\d+ ", "{name} ", server[1]), server[2] or ""
            if servers == 1:
                lines += [f"{head.format(name=n.name)}127.0.0.1:{n.port}{options}" for n in nodes]
        else:
            lines.append(line)
    assert (listens, servers) == (1, 3), f"{path}: not the guide's layout (1 listen, 3 servers)"
    return "\n".join(lines) + "\n"


def _spawn(
    args: list[str], log_path: Path, cwd: Path = REPO_ROOT, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    with open(log_path, "ab") as log:
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, env=env, cwd=cwd)
    LIVE_PROCESSES[process.pid] = process
    return process


def _stop(process: subprocess.Popen[bytes], signum: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=STOP_TIMEOUT)
    LIVE_PROCESSES.pop(process.pid, None)
    if process.stdout is not None:
        process.stdout.close()


def _ready_line(process: subprocess.Popen[bytes], what: str, log_path: Path) -> str:
    """The process's first stdout line, within START_TIMEOUT."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(START_TIMEOUT):
            _stop(process, signal.SIGKILL)
            raise RuntimeError(f"{what} printed nothing within {START_TIMEOUT}s; see {log_path}")
    line = process.stdout.readline().decode(errors="replace").strip()
    if not line.startswith("READY "):
        _stop(process, signal.SIGKILL)
        raise RuntimeError(f"{what} did not start ({line!r}); see {log_path}")
    return line


class WebNode:
    """One `stickless serve` process."""

    def __init__(
        self,
        index: int,
        redis_url: str,
        namespace: str,
        log_dir: Path,
        tokens: Path | None,
        config: dict[str, Any] | None = None,
        opener: str | None = None,
    ) -> None:
        self.index = index
        #: `--opener` of the node (None: the demo agent).
        self.opener = opener
        self.name = f"web-{index}"
        self.port = free_port()
        self.redis_url = redis_url
        self.namespace = namespace
        self.tokens = tokens
        #: RouterConfig overrides on top of WEB_CONFIG.
        self.config = {**WEB_CONFIG, **(config or {})}
        self.log_path = log_dir / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        #: The router's node id (with its incarnation), from the READY line.
        self.node_id = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        args = [
            sys.executable, "-m", "stickless", "serve",
            "--redis", self.redis_url,
            "--namespace", self.namespace,
            "--port", str(self.port),
            "--node-id", self.name,
            "--grace", "2",
            "--config", json.dumps(self.config),
        ]  # fmt: skip
        if self.tokens is not None:
            args += ["--tokens", str(self.tokens)]
        if self.opener is not None:
            args += ["--opener", self.opener]
        self.process = _spawn(args, self.log_path)
        self.node_id = _ready_line(self.process, self.name, self.log_path).split()[2]

    def sigkill(self) -> None:
        if self.process is not None:
            _stop(self.process, signal.SIGKILL)

    def terminate(self) -> int | None:
        """SIGTERM and wait; the exit code (None when it was not started)."""
        if self.process is None:
            return None
        _stop(self.process, signal.SIGTERM)
        return self.process.returncode


class Haproxy:
    """haproxy on loopback: round robin over the nodes, no stickiness, health-checked on
    /readyz so a killed node leaves the rotation within a second; a request refused by a dead
    node is sent to the next one."""

    def __init__(self, nodes: list[WebNode], log_dir: Path) -> None:
        self.port = free_port()
        self.nodes = nodes
        self.config_path = log_dir / "haproxy.cfg"
        self.log_path = log_dir / "haproxy.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        return render_config(DEPLOY / "haproxy.cfg", self.port, self.nodes)

    def start(self) -> None:
        self.config_path.write_text(self.config())
        args = [haproxy_executable(), "-db", "-f", str(self.config_path)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=log, cwd=REPO_ROOT)
        LIVE_PROCESSES[self.process.pid] = self.process
        self.wait_serving(len(self.nodes))

    def wait_serving(self, nodes: int) -> None:
        """Wait until `nodes` different nodes answer /healthz through the balancer."""
        deadline = time.monotonic() + START_TIMEOUT
        seen: set[str] = set()
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, "haproxy exited"
            try:
                answer = httpx.get(f"{self.url}/healthz", timeout=2)
                if answer.status_code == 200:
                    seen.add(answer.json()["node_id"])
            except httpx.HTTPError:
                pass
            if len(seen) >= nodes:
                return
            time.sleep(0.1)  # polling a process we do not control: no event to await
        raise RuntimeError(
            f"haproxy served {sorted(seen)} within {START_TIMEOUT}s; see {self.log_path}"
        )

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process, signal.SIGTERM)


class Nginx(Haproxy):
    """nginx on loopback with deploy/nginx.conf: round robin, no stickiness, no active checks
    (a request refused by a dead node is sent to the next one)."""

    def __init__(self, nodes: list[WebNode], log_dir: Path) -> None:
        super().__init__(nodes, log_dir)
        self.config_path = log_dir / "nginx.conf"
        self.log_path = log_dir / "nginx.log"
        self.prefix = log_dir / "nginx"

    def config(self) -> str:
        return render_config(DEPLOY / "nginx.conf", self.port, self.nodes)

    def start(self) -> None:
        self.prefix.mkdir(exist_ok=True)
        self.config_path.write_text(self.config())
        # In the foreground, its pid file, error log and temporary files under the test's own
        # directory (the master stops its workers when stopped by its pid).
        direct = f"daemon off; pid {self.prefix}/nginx.pid; error_log {self.log_path};"
        args = [nginx_executable(), "-p", str(self.prefix), "-c", str(self.config_path),
                "-g", direct]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=log, cwd=REPO_ROOT)
        LIVE_PROCESSES[self.process.pid] = self.process
        self.wait_serving(len(self.nodes))


class WebCluster:
    """`nodes` serve processes over `redis_url` behind haproxy (or `balancer=Nginx`)."""

    def __init__(
        self,
        redis_url: str,
        log_dir: Path,
        nodes: int = 3,
        tokens: dict[str, str] | None = None,
        opener: str | None = None,
        balancer: type[Haproxy] = Haproxy,
    ) -> None:
        token_file = None
        if tokens is not None:
            token_file = log_dir / "tokens.json"
            token_file.write_text(json.dumps(tokens))
        namespace = f"web{os.getpid()}x{free_port()}"
        self.nodes = [
            WebNode(i, redis_url, namespace, log_dir, token_file, opener=opener)
            for i in range(nodes)
        ]
        self.balancer = balancer(self.nodes, log_dir)
        self.log_dir = log_dir

    @property
    def url(self) -> str:
        return self.balancer.url

    def node_named(self, node_id: str) -> WebNode:
        """The node whose router id is `node_id`."""
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise LookupError(node_id)

    def __enter__(self) -> WebCluster:
        try:
            for node in self.nodes:
                node.start()
            self.balancer.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.balancer.stop()
        for node in self.nodes:
            node.terminate()
