"""The loop on three hosts (tests/hosts/netns.py: network namespaces with an address each on
198.18.0.0/24, joined by a bridge, no default route): the head host runs PostgreSQL, Redis and
the conductor (the `default` queue's worker with beat in it, as docker-compose.yml runs it);
the two worker hosts each run a rollout (explorer) and a train worker that reach the head
only at its address, as docker-compose.worker-host.yml's do. Storage is a folder every host
mounts (namespaces share the filesystem), as docs/how-to/several-hosts.md requires.

A run on them trains to its end with the weights of the same run on one host (the explorer
seeds each step from the run's seed, the trainer rebuilds from its journal: both deterministic
on CPU). Then, on one run: the head's Redis restarted, a worker host's link cut for 30 s while
it runs a step, and every process of the other worker host killed while it runs a step; after
each the run moves on within a bound, and at its end SQL shows every experience trained once
and every step recorded once. Each fault's time to recover is printed. And on a run of its
own, a learner gang with a rank on each worker host: the second rank's host cut off mid-step
fails the step within the run's collective timeout, naming the rank and its host, and the run
resumes on a re-formed gang once the host is back.

Marked `hosts`: `make test-hosts` and `make test-stress` run it, `make test` does not (it
needs root and takes minutes). Leases and the broker's visibility timeout stay at production
length, as in tests/test_faults.py: recovery within seconds is the loop's own doing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from tests.hosts.netns import SUBNET, Host, Network, network, unavailable
from tests.run_invariants import experiences_used_once
from tests.servers import ROOT, as_postgres_user, spawn, stop, stop_together

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

HEAD = f"{SUBNET}.1"
PG_PORT, REDIS_PORT = 5432, 6379  # each host has ports of its own: the compose files' defaults
RECOVER_S = 30.0  # the bound on every fault's recovery
CUT_S = 30.0  # how long a link stays cut
READY_S = 240.0  # a worker's start (torch and TRL imported) on a loaded 2-core host
BATCH = 8  # explore_batch_size 2 × repeat_times 4: one train step's experiences
EQUAL_STEPS = 8  # the comparison's run length
# The head's PostgreSQL runs with docker-compose.yml's settings (its TCP keepalives: a
# silent host's session, and so a cut trainer's lock on its run, goes within ~11 s; with the
# kernel's 2 h default the loop could not hand a cut host's train step to the other one).
PG_SETTINGS = " ".join(yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["postgres"]["command"][1:])
PG_BIN = Path(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))[-1]).parent if list(
    Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")) else None


@dataclass
class Cluster:
    net: Network
    base: Path
    env: dict[str, str]
    model: Path
    redis: subprocess.Popen[bytes] | None = None
    workers: dict[str, tuple[Host, subprocess.Popen[bytes]]] = field(default_factory=dict)
    # The one-host run (its id and seconds), made once for the tests that compare with it.
    one_host: tuple[int, float] | None = None

    # ---- the head's services, seen from the test process through their Unix sockets
    def sql(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(host=str(self.base / "pg"), port=PG_PORT, user="postgres", dbname="rftweb",
                             autocommit=True, connect_timeout=5) as conn:
            return list(conn.execute(query, params).fetchall())

    def pg_ctl(self, *args: str) -> None:
        subprocess.run([*self.net["head"].wrap(), *as_postgres_user(), str(_pg_bin() / "pg_ctl"), "-D",
                        str(self.base / "pg" / "data"), "-w", "-t", "60", "-l", str(self.base / "pg" / "server.log"),
                        *args], check=True, capture_output=True, timeout=90)

    def redis_start(self) -> None:
        sock = self.base / "redis" / "redis.sock"
        sock.unlink(missing_ok=True)
        # Bound to the head's loopback too: a worker host must not reach it there. Protected mode
        # off: it would refuse the worker hosts (the bridge reaches nothing else).
        self.redis = spawn([*self.net["head"].wrap(), "redis-server", "--port", str(REDIS_PORT), "--bind", HEAD,
                            "127.0.0.1", "--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir", str(self.base / "redis"),
                            "--unixsocket", str(sock)], env=dict(os.environ), log=self.base / "redis" / "redis.log")
        _until("redis-server up", lambda: _answers_unix(sock), 20)

    def redis_restart(self) -> None:
        assert self.redis is not None
        stop(self.redis)
        self.redis_start()

    def run(self, *cmd: str) -> str:
        """A command on the head host (migrations, making a run); its output."""
        done = subprocess.run([*self.net["head"].wrap(), sys.executable, *cmd], cwd=ROOT, env=self.env, check=True,
                              capture_output=True, text=True, timeout=300)
        return done.stdout

    # ---- Celery workers, each on its host
    def start(self, *specs: tuple[str, str, str], extra: dict[str, str] | None = None) -> None:
        """Workers (host, role, queue) started together, with `extra` in their environment;
        returns once each has written its first heartbeat row (it reached the head's Postgres
        and Redis from its host). Those already running are left as they are."""
        specs = tuple(spec for spec in specs if f"{spec[1]}@{spec[0]}" not in self.workers)
        since = self.db_now()
        for host_name, role, queue in specs:
            node, host = f"{role}@{host_name}", self.net[host_name]
            cmd = [*host.wrap(), sys.executable, "-m", "celery", "-A", "rftweb", "worker", "-P", "solo", "-Q", queue,
                   "-n", node, "--without-gossip", "--without-mingle", "-l", "INFO"]
            if queue == "default":
                cmd += ["-B", "-s", str(self.base / f"beat-{host_name}")]
            self.workers[node] = (host, spawn(cmd, env={**self.env, **(extra or {})}, log=self.base / "logs" / f"{node}.log"))
        nodes = [f"{role}@{h}" for h, role, _ in specs]
        _until(f"workers {nodes} ready", lambda: self.ready(nodes, since), READY_S, self.logs)

    def ready(self, nodes: list[str], since: float) -> bool:
        for node in nodes:
            if self.workers[node][1].poll() is not None:
                pytest.fail(f"worker {node} exited: {self.log(node)}")
        rows = self.sql("SELECT count(*) FROM runs_workerheartbeat WHERE hostname = ANY(%s) AND last_seen > to_timestamp(%s)",
                        [nodes, since])
        return bool(rows[0][0] == len(nodes))

    def stop(self, *nodes: str) -> None:
        stop_together([self.workers.pop(node)[1] for node in nodes if node in self.workers])

    def kill_host(self, host_name: str) -> int:
        """Every process of the host SIGKILLed (its workers and whatever they forked)."""
        killed = self.net[host_name].kill_everything()
        for node, (host, proc) in list(self.workers.items()):
            if host.name == host_name:
                proc.wait(timeout=30)
                del self.workers[node]
        return killed

    def log(self, node: str) -> str:
        path = self.base / "logs" / f"{node}.log"
        return path.read_text(errors="replace")[-2500:] if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{self.log(n)}" for n in sorted({p.stem for p in (self.base / "logs").glob("*.log")}))

    def db_now(self) -> float:
        return float(self.sql("SELECT extract(epoch FROM now())")[0][0])

    # ---- runs
    def run_make(self, *, steps: int, name: str, trainer: dict[str, int] | None = None) -> int:
        script = _CREATE_RUN.format(model=str(self.model), steps=steps, name=name, trainer=trainer or {})
        return int(self.run("-c", script).strip().splitlines()[-1])

    def run_timed(self, *, name: str, trainer: dict[str, int] | None = None) -> tuple[int, float]:
        """An EQUAL_STEPS run on the workers running now, to its end; its id and seconds."""
        started = time.monotonic()
        run_id = self.run_make(steps=EQUAL_STEPS, name=name, trainer=trainer)
        self.wait(f"run {name} to finish", lambda: self.state(run_id)[0] == "finished", 600, run_id)
        seconds = time.monotonic() - started
        assert self.state(run_id) == ("finished", EQUAL_STEPS, EQUAL_STEPS, ""), self.logs()
        experiences_used_once(self.sql, run_id, steps=EQUAL_STEPS, batch=BATCH)
        return run_id, seconds

    def one_host_run(self) -> tuple[int, float]:
        """The comparison's run with the rollout and train workers on the head alone."""
        if self.one_host is None:
            self.stop("explorer@w1", "trainer@w1", "explorer@w2", "trainer@w2")
            self.start(("head", "explorer", "rollout"), ("head", "trainer", "train"))
            self.one_host = self.run_timed(name="one-host")
            self.stop("explorer@head", "trainer@head")
        return self.one_host

    def processed(self) -> dict[str, int]:
        return dict(self.sql("SELECT hostname, processed FROM runs_workerheartbeat"))

    def state(self, run_id: int) -> tuple[str, int, int, str]:
        return tuple(self.sql("SELECT status, explore_step, train_step, error FROM runs_run WHERE id = %s",
                              [run_id])[0])  # type: ignore[return-value]

    def wait(self, what: str, until: Callable[[], bool], timeout: float, run_id: int) -> float:
        def done() -> bool:
            if self.state(run_id)[0] == "failed":
                pytest.fail(f"the run failed: {self.state(run_id)[3]}\n{self.logs()}")
            return until()
        return _until(what, done, timeout, self.logs)

    def progress(self, run_id: int) -> int:
        _, explored, trained, _ = self.state(run_id)
        return explored + trained

    def moves_on(self, run_id: int, fault: str, timeout: float = RECOVER_S) -> float:
        before = self.progress(run_id)
        assert self.state(run_id)[0] == "running", f"the run ended before {fault}; give it more steps"
        return self.wait(f"the run going on after {fault}",
                         lambda: self.progress(run_id) > before or self.state(run_id)[0] == "finished", timeout, run_id)

    def running_on(self, run_id: int, host_name: str, kinds: tuple[str, ...] = ("explore", "train")) -> bool:
        return bool(self.sql("SELECT 1 FROM runs_dispatch WHERE run_id = %s AND job = ANY(%s)"
                             " AND state = 'running' AND worker LIKE %s", [run_id, list(kinds), f"%@{host_name}"]))

    def final_weights(self, run_id: int) -> dict[str, Any]:
        from safetensors.torch import load_file

        checkpoint = self.sql("SELECT checkpoint FROM runs_modelversion WHERE run_id = %s ORDER BY number DESC LIMIT 1",
                              [run_id])[0][0]
        return load_file(str(Path(checkpoint) / "model.safetensors"))


_CREATE_RUN = """
import django
django.setup()
from apps.runs.services import run_transition
from tests.factories import make_run, make_taskset, make_user
owner = make_user({name!r} + "-owner")
run = make_run(owner=owner, taskset=make_taskset(2 * {steps}, owner=owner), name={name!r}, model={model!r},
               engine="transformers", mode="sync", sync_interval=1, total_steps={steps}, explore_batch_size=2,
               repeat_times=4, train_batch_size=8, seed=7, sampling={{"temperature": 1.0, "max_tokens": 8}},
               trainer={{"learning_rate": 1e-3, "loss_type": "grpo", **{trainer!r}}},
               rewards=[{{"name": "length_penalty", "params": {{"max_chars": 4}}}}])
run_transition(run=run, action="start", actor=owner)
print(run.pk)
"""


def _versions_close(a: dict[str, Any], b: dict[str, Any]) -> None:
    import torch

    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=1e-4, rtol=1e-3)


def _pg_bin() -> Path:
    if PG_BIN is not None:
        return PG_BIN
    from rftweb import localpg

    return localpg.bin_dir()


def _answers_unix(path: Path) -> bool:
    import socket

    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(1)
            s.connect(str(path))
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _until(what: str, cond: Callable[[], bool], timeout: float, logs: Callable[[], str] = lambda: "") -> float:
    """Poll `cond` until true (the seconds it took) or fail after `timeout`; a Postgres or Redis
    restarting in between counts as not yet."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if cond():
                return time.monotonic() - started
        except psycopg.OperationalError:
            pass
        time.sleep(0.2)
    pytest.fail(f"{what}: not within {timeout:.0f} s\n{logs()}")


@pytest.fixture(scope="module")
def cluster(demo_model_dir: Path) -> Iterator[Cluster]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    # Outside pytest's tmp (private to root): the postgres user must reach its data.
    base = Path(tempfile.mkdtemp(prefix="rft-hosts-"))
    os.chmod(base, 0o755)
    cluster: Cluster | None = None
    try:
        with network("head", "w1", "w2") as net:
            env = {k: v for k, v in os.environ.items() if k not in {"TEST_DATABASE_NAME", "PYTEST_XDIST_WORKER"}}
            env.update(
                DATABASE_URL=f"postgres://postgres@{HEAD}:{PG_PORT}/rftweb", REDIS_URL=f"redis://{HEAD}:{REDIS_PORT}/0",
                DJANGO_SETTINGS_MODULE="rftweb.settings", PYTHONPATH=str(ROOT), RFT_STORAGE_DIR=str(base / "storage"),
                OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", RFT_CONDUCT_SECONDS="0.3", RFT_HEARTBEAT_SECONDS="1",
                RFT_WORKER_DEAD_SECONDS="4", RFT_DISPATCH_RESEND_SECONDS="5", RFT_FAST_PASSWORD_HASHER="1",
            )
            cluster = Cluster(net=net, base=base, env=env, model=demo_model_dir)
            _head_services(cluster)
            cluster.start(("head", "conductor", "default"))
            yield cluster
            for node in list(cluster.workers):
                print(node, "processed", cluster.sql("SELECT processed FROM runs_workerheartbeat WHERE hostname = %s",
                                                     [node]))
    finally:
        if cluster is not None:
            stop_together([p for _, p in cluster.workers.values()], timeout=5)
            if cluster.redis is not None:
                stop(cluster.redis, timeout=5)
        # The namespaces' removal (network's exit) has killed whatever was left in them. The
        # workers' logs are kept for a look after a failure (the last run's only).
        if (base / "logs").exists():
            shutil.copytree(base / "logs", Path(tempfile.gettempdir()) / "rft-hosts-last-logs", dirs_exist_ok=True)
        shutil.rmtree(base, ignore_errors=True)


def _head_services(cluster: Cluster) -> None:
    pg, head = cluster.base / "pg", cluster.net["head"]
    pg.mkdir()
    (cluster.base / "redis").mkdir()
    shutil.chown(pg, "postgres", "postgres") if os.geteuid() == 0 else None
    subprocess.run([*as_postgres_user(), str(_pg_bin() / "initdb"), "-D", str(pg / "data"), "-U", "postgres", "-A",
                    "trust", "--no-sync"], check=True, capture_output=True, timeout=120)
    # The worker hosts connect over the bridge (initdb trusts only local connections).
    with (pg / "data" / "pg_hba.conf").open("a") as hba:
        hba.write(f"host all all {SUBNET}.0/24 trust\n")
    cluster.pg_ctl("-o", f"-p {PG_PORT} -k {pg} -c listen_addresses={HEAD} -c fsync=off {PG_SETTINGS}", "start")
    subprocess.run([*head.wrap(), *as_postgres_user(), str(_pg_bin() / "createdb"), "-h", HEAD, "-p", str(PG_PORT),
                    "-U", "postgres", "rftweb"], check=True, capture_output=True, timeout=60)
    cluster.redis_start()
    cluster.run("manage.py", "migrate", "--noinput", "-v", "0")


def test_each_host_reaches_the_head_at_its_address_only(cluster: Cluster) -> None:
    w1, w2, head = cluster.net["w1"], cluster.net["w2"], cluster.net["head"]
    for host in (w1, w2):
        assert host.reaches(HEAD, PG_PORT) and host.reaches(HEAD, REDIS_PORT)
        # Redis listens on the head's loopback too: only the head reaches it there.
        assert not host.reaches("127.0.0.1", REDIS_PORT)
        # No default route: nothing past the bridge.
        assert not host.reaches("192.0.2.1", 80, timeout=1)
    assert head.reaches("127.0.0.1", REDIS_PORT)
    assert w1.reaches(w2.address, PG_PORT) is False  # nothing listens there: refused, not routed elsewhere
    # The root namespace got no address on the bridge's range.
    assert f"{SUBNET}." not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout


def test_a_run_on_three_hosts_ends_with_the_one_host_runs_weights(cluster: Cluster) -> None:
    import torch

    one, one_s = cluster.one_host_run()
    # Three hosts: rollout and train workers on both worker hosts, none on the head.
    cluster.start(("w1", "explorer", "rollout"), ("w1", "trainer", "train"), ("w2", "explorer", "rollout"),
                  ("w2", "trainer", "train"))
    before = cluster.processed()
    three, three_s = cluster.run_timed(name="three-hosts")
    taken = {node: n - before.get(node, 0) for node, n in cluster.processed().items() if node.endswith(("@w1", "@w2"))}
    a, b = cluster.final_weights(one), cluster.final_weights(three)
    assert a.keys() == b.keys() and a
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"tensors differ from the one-host run's: {differ[:5]}"
    # Once more on one host, its caches as warm as the three-host run's: the time to compare.
    cluster.stop("explorer@w1", "trainer@w1", "explorer@w2", "trainer@w2")
    cluster.start(("head", "explorer", "rollout"), ("head", "trainer", "train"))
    again, again_s = cluster.run_timed(name="one-host-again")
    cluster.stop("explorer@head", "trainer@head")
    assert all(torch.equal(a[k], v) for k, v in cluster.final_weights(again).items())
    print(f"{EQUAL_STEPS} steps: one host {one_s:.1f} s (first), three hosts {three_s:.1f} s, one host again"
          f" {again_s:.1f} s; tasks taken by the worker hosts' workers {taken}")


def test_a_learner_gang_with_a_rank_on_each_worker_host_trains_over_gloo(cluster: Cluster) -> None:
    """trainer.processes 2, trainer.hosts 2: the train worker on w1 is rank 0 and opens the
    gang's store at its own address; `python -m workers.trainer.follower join` on w2
    (docker-compose.worker-host.yml's learner-ranks) is rank 1, over gloo on the bridge. The
    first version equals the one-process run's within float tolerance (a two-rank reduction
    sums in another order, so later steps may sample other completions: those are checked for
    being trained once, not for equal weights)."""
    one, _ = cluster.one_host_run()
    w1, w2 = cluster.net["w1"], cluster.net["w2"]
    cluster.stop("trainer@w1", "trainer@w2")
    cluster.start(("w1", "explorer", "rollout"), ("w2", "explorer", "rollout"))
    # The machine's name resolves to 127.0.0.1 here: gloo must be told which interface is the
    # host's (GLOO_SOCKET_IFNAME), or each rank would offer the others its own loopback.
    gang_env = {"RFT_LEARNER_ADDR": w1.address, "RFT_LEARNER_PORT": "29600", "GLOO_SOCKET_IFNAME": "eth0"}
    cluster.start(("w1", "trainer", "train"), extra=gang_env)
    rank1 = spawn([*w2.wrap(), sys.executable, "-m", "workers.trainer.follower", "join", w1.address,
                   gang_env["RFT_LEARNER_PORT"], "1"], env={**cluster.env, **gang_env},
                  log=cluster.base / "logs" / "rank1@w2.log")
    try:
        gang, gang_s = cluster.run_timed(name="learner-gang", trainer={"processes": 2, "hosts": 2})
        ranks = cluster.sql("SELECT step, value FROM runs_metric WHERE run_id = %s AND name = 'learner_processes'"
                            " ORDER BY step", [gang])
        assert ranks == [(s, 2.0) for s in range(1, EQUAL_STEPS + 1)], ranks
        from safetensors.torch import load_file

        first = {r: load_file(str(Path(cluster.sql("SELECT checkpoint FROM runs_modelversion WHERE run_id = %s AND"
                                                   " number = 1", [r])[0][0]) / "model.safetensors")) for r in (one, gang)}
        _versions_close(first[one], first[gang])
        print(f"{EQUAL_STEPS} steps with a learner gang across w1 and w2: {gang_s:.1f} s")
    finally:
        stop(rank1)
        cluster.stop("trainer@w1")


# The learner gang's collective timeout in the rank-loss test (trainer.collective_timeout_s),
# and how long the rank's host stays cut off: past one re-forming try, so the gang is seen
# waiting for the host, not only failing.
COLLECTIVE_S = 20
RANK_CUT_S = 60.0


def test_a_learner_ranks_host_cut_off_mid_step_fails_the_step_within_the_bound_and_the_run_resumes_when_it_is_back(
    cluster: Cluster,
) -> None:
    """trainer.processes 2, hosts 2, collective_timeout_s 20: rank 0 is the train worker on
    w1, rank 1 the `join` on w2, which restarts it whenever it ends (the compose file's
    `restart: always`). While rank 0 runs a train step, w2's link is cut (no reset: its
    connections stall, as when its host loses power): the step fails within the timeout
    plus the heartbeat watch with a reason naming rank 1 and w2's address on the run page;
    the run keeps running; while w2 is away each re-forming try waits the timeout for it and
    says so. Once the link is back the gang re-forms and the run goes on; at its end every
    experience was trained once and every step recorded once."""
    from workers.algorithms.gang import SILENT_S

    w1, w2 = cluster.net["w1"], cluster.net["w2"]
    cluster.stop("trainer@w1", "trainer@w2", "explorer@w2")
    cluster.start(("w1", "explorer", "rollout"))
    gang_env = {"RFT_LEARNER_ADDR": w1.address, "RFT_LEARNER_PORT": "29601", "GLOO_SOCKET_IFNAME": "eth0"}
    cluster.start(("w1", "trainer", "train"), extra=gang_env)
    join = (f"while true; do {sys.executable} -m workers.trainer.follower join {w1.address}"
            f" {gang_env['RFT_LEARNER_PORT']} 1; sleep 1; done")
    rank1 = spawn([*w2.wrap(), "bash", "-c", join], env={**cluster.env, **gang_env},
                  log=cluster.base / "logs" / "rank1-again@w2.log")
    try:
        run_id = cluster.run_make(steps=600, name="rank-lost", trainer={"processes": 2, "hosts": 2,
                                                                         "collective_timeout_s": COLLECTIVE_S})
        cluster.wait("the gang's first step", lambda: cluster.state(run_id)[2] >= 1, 300, run_id)
        cluster.wait("a train step running on w1", lambda: cluster.running_on(run_id, "w1", ("train",)), 120, run_id)
        cut_at, cut_db = time.monotonic(), cluster.db_now()
        trained_at_cut = cluster.state(run_id)[2]
        cluster.net.cut("w2")
        try:
            lost = "SELECT message FROM runs_taskfailure WHERE run_id = %s AND task = 'learner gang' AND created_at > to_timestamp(%s) ORDER BY id"
            detect_s = cluster.wait("the step failing with the lost rank's reason",
                                    lambda: bool(cluster.sql(lost, [run_id, cut_db])), COLLECTIVE_S + SILENT_S + 30, run_id)
            reason = cluster.sql(lost, [run_id, cut_db])[0][0]
            assert f"rank 1 (host 1, {w2.address}) stopped answering" in reason, reason
            assert cluster.state(run_id)[0] == "running"
            time.sleep(max(0.0, RANK_CUT_S - (time.monotonic() - cut_at)))  # the fault's stated length
            waiting = [m for (m,) in cluster.sql(lost, [run_id, cut_db])][1:]
            assert waiting and all("rank 1 (host 1) did not come within 20 s" in m for m in waiting), waiting
            # At most the step the cut met was committed (its collectives done before the cut).
            assert cluster.state(run_id)[2] <= trained_at_cut + 1
        finally:
            cluster.net.mend("w2")
        mended = time.monotonic()
        before = cluster.state(run_id)[2]
        recover_s = cluster.wait("a step trained on the re-formed gang", lambda: cluster.state(run_id)[2] > before,
                                 3 * COLLECTIVE_S + READY_S, run_id)
        steps = cluster.sql("UPDATE runs_run SET config = jsonb_set(config, '{total_steps}', to_jsonb(GREATEST(explore_step,"
                            " train_step) + 2)) WHERE id = %s RETURNING (config->>'total_steps')::int", [run_id])[0][0]
        cluster.wait("the run to finish", lambda: cluster.state(run_id)[0] == "finished", 300, run_id)
        assert cluster.state(run_id) == ("finished", steps, steps, ""), cluster.logs()
        experiences_used_once(cluster.sql, run_id, steps=steps, batch=BATCH)
        # The last step's snapshot is written after the run shows finished: rank 1 stays till then.
        cluster.wait("the last train task's end", lambda: not cluster.running_on(run_id, "w1", ("train",)), 120, run_id)
        tries = len(cluster.sql(lost, [run_id, cut_db]))
        met = reason.split(" stopped answering during ", 1)[-1].split(" (", 1)[0]  # a step, writing a version, …
        print(f"learner rank's host cut mid-step (it met {met}): step failed after {detect_s:.1f} s (collective timeout"
              f" {COLLECTIVE_S:.0f} s), {tries - 1} re-forming tries while cut off, link mended after"
              f" {mended - cut_at:.0f} s -> a step on the re-formed gang {recover_s:.1f} s later;"
              f" load average {os.getloadavg()[0]:.1f}")
        # The bounds: detection within the timeout and the heartbeat watch (plus the 0.2-s poll
        # and a write); recovery within one re-forming window, rank 1's start and the gang's.
        assert detect_s < COLLECTIVE_S + SILENT_S + 10
        assert recover_s < 2 * COLLECTIVE_S + 60
    finally:
        stop(rank1)
        cluster.stop("trainer@w1")


def test_faults_on_three_hosts_each_recover_within_the_bound_and_lose_nothing(cluster: Cluster) -> None:
    cluster.start(("w1", "explorer", "rollout"), ("w1", "trainer", "train"), ("w2", "explorer", "rollout"),
                  ("w2", "trainer", "train"))
    recovered: dict[str, float] = {}
    # Long enough to be running at the last fault on a quiet host (80 ended during the 30-s cut,
    # w1 alone doing a step in 0.4 s); shortened to two steps past the last fault after it.
    steps = 600
    run_id = cluster.run_make(steps=steps, name="faults")
    cluster.wait("the first trained step", lambda: cluster.state(run_id)[2] >= 1, 240, run_id)

    # (c) The head's Redis restarted: every queued message gone, every worker's connection too.
    cluster.redis_restart()
    recovered["head's redis restarted: run moves on"] = cluster.moves_on(run_id, "restarting Redis")

    # (b) w2's link cut for 30 s while it runs a train step (the harder case: its trainer's
    # session holds the run's lock): w1 carries the run meanwhile; once mended, w2's workers
    # are back (a fresh heartbeat each) without being touched.
    cluster.wait("a train step running on w2", lambda: cluster.running_on(run_id, "w2", ("train",)), 120, run_id)
    cut_at = time.monotonic()
    cluster.net.cut("w2")
    try:
        recovered["w2 cut: run moves on via w1"] = cluster.moves_on(run_id, "cutting w2's link")
        time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))  # the fault's stated length, not a guess
    finally:
        cluster.net.mend("w2")
    mended = cluster.db_now()
    recovered["w2 mended: its workers back"] = _until(
        "w2's workers reconnecting", lambda: cluster.ready(["explorer@w2", "trainer@w2"], mended), RECOVER_S, cluster.logs)
    recovered["w2 mended: run moves on"] = cluster.moves_on(run_id, "mending w2's link")

    # (a) Every process of w1 killed while it runs a step: the step goes back and w2 (the
    # host that was cut) takes it and the rest.
    cluster.wait("a step running on w1", lambda: cluster.running_on(run_id, "w1"), 120, run_id)
    running = cluster.sql("SELECT job, step FROM runs_dispatch WHERE run_id = %s AND state = 'running' AND worker LIKE %s"
                          " AND job IN ('explore', 'train')", [run_id, "%@w1"])
    killed_at = cluster.db_now()
    killed = cluster.kill_host("w1")
    for kind, step in running:  # (it may have ended between the wait and the kill)
        recovered[f"w1 killed: its {kind} step taken by w2"] = cluster.wait(
            f"w1's {kind} step {step} taken again", lambda: bool(cluster.sql(
                "SELECT 1 FROM runs_dispatch WHERE run_id = %s AND job = %s AND (step > %s OR (state = 'running'"
                " AND worker LIKE %s AND started_at > to_timestamp(%s)))", [run_id, kind, step, "%@w2", killed_at])),
            RECOVER_S, run_id)
    assert killed >= 2 and cluster.net["w1"].pids() == []
    recovered["w1 killed: run moves on via w2"] = cluster.moves_on(run_id, "killing w1")

    steps = cluster.sql("UPDATE runs_run SET config = jsonb_set(config, '{total_steps}', to_jsonb(GREATEST(explore_step,"
                        " train_step) + 2)) WHERE id = %s RETURNING (config->>'total_steps')::int", [run_id])[0][0]
    cluster.wait("the run to finish", lambda: cluster.state(run_id)[0] == "finished", 300, run_id)
    assert cluster.state(run_id) == ("finished", steps, steps, ""), cluster.logs()
    experiences_used_once(cluster.sql, run_id, steps=steps, batch=BATCH)
    print("seconds to recover:", {k: round(v, 1) for k, v in recovered.items()})
    assert max(recovered.values()) < RECOVER_S
