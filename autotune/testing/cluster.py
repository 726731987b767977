"""An emulated cluster on one Linux host: a network namespace per node, joined by a bridge, each
node's link rate-limited, with one torchrun agent per node. For tests and benchmarks; needs root.

Each node is a namespace with its own loopback (ranks on a node talk over it, as on a real node)
and one interface, ``eth0``, cabled to a bridge that lives in a namespace of its own, so the
host's own network is never touched. ``tc``'s token bucket (``tbf``) limits each cable in both
directions. Addresses are private (10.213.0.0/24) and exist only inside the namespaces, which
cannot reach the host or anything beyond it. `Cluster.close` (also on exit from ``with``, and at
interpreter exit) kills every process started in the cluster, then removes the namespaces.

Example::

    with Cluster(nodes=2, ranks_per_node=2, rate_mbit=1000) as cluster:
        done = cluster.torchrun(["examples/train_ddp.py", "--steps", "50"], timeout_s=300)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.config import NETNS_TAG_ENV

__all__ = ["NETNS_PREFIX", "NETNS_TAG_ENV", "Cluster", "NodeRun", "namespaces", "unavailable"]

#: Every namespace a cluster makes is named ``<prefix>[<tag>-]<token>-...``: the leak check looks
#: for it.
NETNS_PREFIX = "autotune-"
#: The environment variable whose value, where set, tags the namespaces a cluster makes, so that
#: one test run (one pytest-xdist worker) can tell its own from those another makes at once.
_SUBNET = "10.213.0"
_RDZV_PORT = 29400  # free: a fresh namespace has nothing listening


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def unavailable() -> str | None:
    """Why a cluster cannot be built here (None: it can): not root, no ``ip`` or ``tc``."""
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "building network namespaces needs root (run the tests as root, or in CI)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing: apt-get install -y iproute2"
    return None


def namespaces(tag: str | None = None) -> list[str]:
    """The network namespaces a cluster made that exist now (``ip netns`` names); with ``tag``,
    only those made under that `NETNS_TAG_ENV`."""
    start = NETNS_PREFIX if tag is None else f"{NETNS_PREFIX}{tag}-"
    try:
        return sorted(n for n in os.listdir("/run/netns") if n.startswith(start))
    except FileNotFoundError:
        return []


@dataclass(frozen=True)
class NodeRun:
    """How one node's process (its torchrun agent) ended."""

    node: int
    returncode: int
    output: str  # stdout and stderr, interleaved


class Cluster:
    """``nodes`` namespaces with ``ranks_per_node`` ranks each (a number, or one per node), their
    links limited to ``rate_mbit`` each way (None: unlimited, as fast as the host's veth)."""

    def __init__(
        self,
        nodes: int,
        ranks_per_node: int | Sequence[int],
        rate_mbit: float | None = None,
        *,
        burst_bytes: int = 256 << 10,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got nodes={nodes}")
        per = [ranks_per_node] * nodes if isinstance(ranks_per_node, int) else ranks_per_node
        if len(per) != nodes or any(r < 1 for r in per):
            raise ValueError(f"ranks_per_node must give each of {nodes} nodes 1+ ranks: {per}")
        if rate_mbit is not None and not rate_mbit > 0:
            raise ValueError(f"rate_mbit must be positive, got {rate_mbit}")
        self.nodes = nodes
        self.ranks_per_node = tuple(per)
        self.rate_mbit = rate_mbit
        self.burst_bytes = burst_bytes
        tag = os.environ.get(NETNS_TAG_ENV)
        self.name = f"{NETNS_PREFIX}{tag + '-' if tag else ''}{secrets.token_hex(3)}"
        self._made: list[str] = []
        self._procs: list[tuple[int, subprocess.Popen[str]]] = []
        self._read: dict[int, str] = {}  # output `wait_for` consumed, by pid
        self._closed = False
        self._sigterm: Any = None  # SIGTERM's handler before this cluster's (see __enter__)
        self._log_dir: str | None = None  # torchrun's, removed by `close`

    # -- building and tearing down -----------------------------------------------------------

    def netns(self, node: int) -> str:
        return f"{self.name}-n{node}"

    def address(self, node: int) -> str:
        return f"{_SUBNET}.{node + 1}"

    @property
    def made(self) -> tuple[str, ...]:
        """The namespaces this cluster made and has not removed yet (switch first)."""
        return tuple(self._made)

    @property
    def world_size(self) -> int:
        return sum(self.ranks_per_node)

    def __enter__(self) -> Cluster:
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(f"cannot build an emulated cluster: {reason}")
        atexit.register(self.close)
        # A SIGTERM (a CI runner's timeout, `kill`) ends the process without atexit or `with`
        # exits: turn it into SystemExit while the cluster exists, so it is still removed.
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self._sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        switch = f"{self.name}-sw"
        self._netns_add(switch)
        self._ip(switch, "link", "add", "br0", "type", "bridge")
        self._ip(switch, "link", "set", "br0", "up")
        for k in range(self.nodes):
            ns = self.netns(k)
            self._netns_add(ns)
            _run(["ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name",
                  f"p{k}", "netns", switch])  # fmt: skip
            self._ip(switch, "link", "set", f"p{k}", "master", "br0")
            self._ip(switch, "link", "set", f"p{k}", "up")
            self._ip(ns, "addr", "add", f"{self.address(k)}/24", "dev", "eth0")
            self._ip(ns, "link", "set", "eth0", "up")
            self._ip(ns, "link", "set", "lo", "up")
            if self.rate_mbit is not None:
                # Out of the node on its own end, into it on the switch's end.
                self._limit(ns, "eth0")
                self._limit(switch, f"p{k}")

    def _limit(self, ns: str, dev: str) -> None:
        _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
              "rate", f"{self.rate_mbit}mbit", "burst", str(self.burst_bytes),
              "latency", "100ms"])  # fmt: skip

    def _netns_add(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self._made.append(ns)

    def _ip(self, ns: str, *args: str) -> None:
        _run(["ip", "-n", ns, *args])

    def close(self) -> None:
        """Kill every process started in the cluster, then remove its namespaces. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        for k in range(self.nodes):
            if self.netns(k) in self._made:
                with contextlib.suppress(RuntimeError):  # gone already: remove the rest anyway
                    self.kill(k)
        for _, p in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)
        errors = []
        for ns in reversed(self._made):
            done = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
            if done.returncode and ns in namespaces():
                errors.append(f"{ns}: {done.stderr.strip()}")
        self._made.clear()
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None
        if errors:
            raise RuntimeError("could not remove namespaces: " + "; ".join(errors))

    # -- running things in it ------------------------------------------------------------------

    def popen(
        self, node: int, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """Start ``argv`` on ``node`` (in its own session, so `close` kills all it starts)."""
        if self._closed or not self._made:
            raise RuntimeError("the cluster is not built (use it in a `with` block)")
        full = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", **(env or {})}
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns(node), *argv],
            env=full,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._procs.append((node, proc))
        return proc

    def torchrun_argv(self, node: int, script: Sequence[str], max_restarts: int = 0) -> list[str]:
        """The torchrun command for ``node``'s agent: c10d rendezvous on node 0's address."""
        return [
            sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={self.nodes}", f"--nproc-per-node={self.ranks_per_node[node]}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={self.address(0)}:{_RDZV_PORT}",
            f"--rdzv-id={self.name}", f"--max-restarts={max_restarts}",
            f"--local-addr={self.address(node)}",
            # torchrun finds the store's host by name; an address of eth0 it does not recognise.
            f"--rdzv-conf=is_host={str(node == 0).lower()}",
            # Its logs where `close` removes them (by default a new directory in /tmp each run).
            f"--log-dir={self._logs()}",
            *script,
        ]  # fmt: skip

    def _logs(self) -> str:
        """The directory of the cluster's torchrun agents' logs (made on first use)."""
        if self._log_dir is None:
            self._log_dir = tempfile.mkdtemp(prefix=f"{self.name}-logs-")
        return self._log_dir

    def start_torchrun(
        self, script: Sequence[str], env: Mapping[str, str] | None = None, max_restarts: int = 0
    ) -> list[subprocess.Popen[str]]:
        """Start one torchrun agent per node running ``script`` (a path and its arguments)."""
        # torchrun numbers nodes in order of arrival: node 0 first, so it hosts the rendezvous
        # and its ranks come first (uneven nodes then get the ranks the test expects).
        agents = []
        for k in range(self.nodes):
            agents.append(self.popen(k, self.torchrun_argv(k, script, max_restarts), env))
            if k == 0:
                time.sleep(1.0)
        return agents

    def torchrun(
        self,
        script: Sequence[str],
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> list[NodeRun]:
        """Run ``script`` under torchrun across the nodes; wait up to ``timeout_s`` for all.

        ``check``: raise RuntimeError, with every node's output, if an agent fails or times out.
        """
        agents = self.start_torchrun(script, env)
        return self.wait(agents, timeout_s=timeout_s, check=check)

    def wait(
        self, agents: Sequence[subprocess.Popen[str]], *, timeout_s: float, check: bool = True
    ) -> list[NodeRun]:
        """Wait for ``agents`` (of `start_torchrun`) and collect how each ended."""
        deadline = time.monotonic() + timeout_s
        runs = []
        timed_out = False
        for k, agent in enumerate(agents):
            try:
                out, _ = agent.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                # The whole node: its ranks (sessions of their own) hold the pipe open too, and
                # would keep `communicate` waiting for an end of output that never comes.
                self.kill(self._node_of(agent))
                out, _ = agent.communicate(timeout=30)
            runs.append(NodeRun(k, agent.returncode, self._read.pop(agent.pid, "") + out))
        if check and (timed_out or any(r.returncode for r in runs)):
            what = f"did not finish within {timeout_s:g} s" if timed_out else "failed"
            raise RuntimeError(
                f"torchrun across {self.nodes} nodes {what}:\n"
                + "\n".join(
                    f"--- node {r.node} (exit {r.returncode})\n{r.output[-4000:]}" for r in runs
                )
            )
        return runs

    def wait_for(self, agent: subprocess.Popen[str], text: str, *, timeout_s: float) -> None:
        """Read ``agent``'s output until it holds ``text`` (`wait` still returns all of it).

        Raises RuntimeError, with what it printed, if the agent ends or ``timeout_s`` passes first.
        """
        assert agent.stdout is not None
        # Straight from the descriptor, as `communicate` reads later: nothing buffered in between.
        fd = agent.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        got = bytearray()
        while text.encode() not in got:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # it ended
                break
            got += chunk
        self._read[agent.pid] = self._read.get(agent.pid, "") + got.decode(errors="replace")
        if text.encode() not in got:
            raise RuntimeError(
                f"node {self._node_of(agent)} printed no {text!r} within {timeout_s:g} s:\n"
                + self._read[agent.pid][-4000:]
            )

    def _node_of(self, proc: subprocess.Popen[str]) -> int:
        return next(node for node, p in self._procs if p is proc)

    def pids(self, node: int) -> list[int]:
        """The processes running in ``node``'s namespace now."""
        return [int(p) for p in _run(["ip", "netns", "pids", self.netns(node)]).split()]

    def kill(self, node: int) -> None:
        """Kill everything running on ``node``, as a node failure would: every process in its
        namespace (torchrun's ranks run in sessions of their own, apart from their agent)."""
        for where, p in self._procs:
            if where == node and p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        for pid in self.pids(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def cut(self, node: int) -> None:
        """Take ``node``'s link down, as a pulled cable would: its processes live on, and no
        peer hears of it (no reset reaches them); only timeouts can tell."""
        self._ip(self.netns(node), "link", "set", "eth0", "down")

    def qdisc(self, node: int) -> str:
        """``tc qdisc show`` of the node's interface: what limits its link."""
        return _run(["ip", "netns", "exec", self.netns(node), "tc", "qdisc", "show", "dev", "eth0"])


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout
