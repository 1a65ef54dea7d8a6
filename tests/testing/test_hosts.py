"""Simulated hosts: network namespaces on a switch, each host with its own loopback,
address, optionally its own /dev/shm and a bandwidth limit; everything removed afterwards,
also when their maker is killed."""
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from distgrad.testing import hosts as simulated

pytestmark = pytest.mark.timeout(60)


def _namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def listen_once(port):
    """Accept one connection on every address of this host, answer with its address."""
    with socket.create_server(("", port)) as server:
        conn, _ = server.accept()
        with conn:
            conn.sendall(conn.getsockname()[0].encode())
    return "served"


def fetch(host, port, timeout=10.0):
    """What the server at ``host``:``port`` answers, retried until it listens."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1) as s:
                return s.recv(100).decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def shm_files():
    return sorted(os.listdir("/dev/shm"))


def touch_shm(name):
    with open(os.path.join("/dev/shm", name), "w"):
        pass
    return True


def fail(text):
    raise ValueError(text)


def test_hosts_reach_each_other_by_address_and_name_and_each_has_its_own_loopback(
        simulated_hosts):
    a, b = simulated_hosts(2)
    assert (a.name, b.name) == ("host0", "host1") and a.address != b.address
    server = a.spawn(listen_once, 7000)
    assert b.spawn(fetch, "host0", 7000).result(30) == a.address
    assert server.result(30) == "served"
    # host1's loopback is its own: nothing of host0 answers there
    loop = a.spawn(listen_once, 7001)
    with pytest.raises(simulated.HostCallError, match="ConnectionRefused"):
        b.spawn(fetch, "127.0.0.1", 7001, 0.3).result(30)
    assert b.spawn(fetch, a.address, 7001).result(30) == a.address
    assert loop.result(30) == "served"


def test_a_private_shm_is_shared_on_its_host_and_apart_from_the_others(simulated_hosts):
    a, b = simulated_hosts(2, private_shm=True)
    assert a.spawn(touch_shm, "dg-test-marker").result(30)
    assert "dg-test-marker" in a.spawn(shm_files).result(30)
    assert "dg-test-marker" not in b.spawn(shm_files).result(30)
    assert "dg-test-marker" not in os.listdir("/dev/shm")


def test_a_function_on_a_host_returns_its_value_or_its_error_with_the_traceback(
        simulated_hosts):
    (a,) = simulated_hosts(1)
    marker = f"dg-test-{os.getpid()}-marker"
    touch_shm(marker)
    try:  # without private_shm a host sees the machine's /dev/shm
        assert marker in a.spawn(shm_files).result(30)
    finally:
        os.unlink(os.path.join("/dev/shm", marker))
    with pytest.raises(simulated.HostCallError, match=r"ValueError: broken[\s\S]*in fail"):
        a.spawn(fail, "broken").result(30)
    done = a.run([sys.executable, "-c", "import sys; print(sys.argv[1])", "hello"])
    assert done.stdout == "hello\n"
    with pytest.raises(TimeoutError, match="still ran after"):
        a.run(["sleep", "30"], timeout=0.5)


def test_the_bandwidth_limit_holds_a_host_to_its_rate(simulated_hosts):
    a, b = simulated_hosts(2, bandwidth="40Mbit/s")
    script = textwrap.dedent("""
        import socket, sys, time
        s = socket.create_connection((sys.argv[1], 7002), timeout=10)
        t = time.monotonic(); s.sendall(bytes(2_000_000)); s.shutdown(socket.SHUT_WR)
        s.recv(1); print(time.monotonic() - t)
    """)
    sink = a.popen([sys.executable, "-c", textwrap.dedent("""
        import socket
        with socket.create_server(("", 7002)) as srv:
            c, _ = srv.accept()
            while c.recv(1 << 16): pass
            c.sendall(b"k")
    """)])
    deadline = time.monotonic() + 10
    while True:
        done = b.run([sys.executable, "-c", script, a.address], check=False)
        if done.returncode == 0 or time.monotonic() > deadline:
            break
    assert done.returncode == 0, done.stderr
    # 2 MB at 40 Mbit/s take 0.4 s at least; unshaped, a few milliseconds
    assert float(done.stdout) > 0.3
    sink.wait(10)


def test_nothing_is_left_after_close_or_after_the_maker_is_killed(tmp_path):
    why = simulated.unavailable()
    if why:
        pytest.skip(why)
    with simulated.SimulatedHosts(2, private_shm=True, attach_caller=True) as made:
        names = {h.netns for h in made} | {made.switch}
        shm = [h.shm_dir for h in made]
        sleeper = made[1].popen(["sleep", "60"])
        unread = made[0].spawn(shm_files)  # a call whose result nobody reads
        assert names <= _namespaces()
    assert not names & _namespaces() and not any(os.path.exists(p) for p in shm)
    assert unread.poll() is not None and not os.path.exists(made.calls_dir)
    assert sleeper.poll() is not None
    maker = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import json, sys
        from distgrad.testing.hosts import SimulatedHosts
        made = SimulatedHosts(2, attach_caller=True)
        made[0].popen(["sleep", "60"])
        print(json.dumps([h.netns for h in made] + [made.switch]), flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        names = set(json.loads(maker.stdout.readline()))
        assert names <= _namespaces()
    finally:
        maker.kill()
        maker.wait()
    deadline = time.monotonic() + 20
    while names & _namespaces() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not names & _namespaces(), "the guardian left namespaces of a killed maker"


def test_the_command_line_makes_lists_runs_on_and_removes_hosts():
    why = simulated.unavailable()
    if why:
        pytest.skip(why)
    name = f"dgcli{os.getpid()}"

    def cli(*args):  # owned by this process: swept later if it dies before `down`
        return subprocess.run([sys.executable, "-m", "distgrad", "hosts", *args],
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, DISTGRAD_HOSTS_OWNER=str(os.getpid())))
    try:
        up = cli("up", "2", "--name", name, "--ipv6")
        assert up.returncode == 0, up.stderr
        assert "host1" in up.stdout and name in cli("list").stdout
        again = cli("up", "2", "--name", name)
        assert again.returncode == 2 and "exist already" in again.stderr
        ran = cli("exec", "host1", "--name", name, "--", sys.executable, "-c",
                  "import socket; print(socket.gethostbyname('host0'))")
        assert ran.returncode == 0 and ran.stdout.strip().startswith("10."), ran.stderr
        nowhere = cli("exec", "host9", "--name", name, "--", "true")
        assert nowhere.returncode == 2 and "no simulated host 'host9'" in nowhere.stderr
    finally:
        down = cli("down", "--name", name)
    assert down.returncode == 0 and name not in cli("list").stdout


def test_where_hosts_cannot_be_made_the_reason_is_given(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "need root" in simulated.unavailable()
    with pytest.raises(OSError, match="need root"):
        simulated.SimulatedHosts(2)
    assert simulated.parse_rate("1Gbit/s") == 1e9
    with pytest.raises(ValueError, match="such as '1Gbit/s'"):
        simulated.parse_rate("fast")


def test_a_dropped_port_goes_unanswered_and_the_others_still_work(simulated_hosts):
    a, b = simulated_hosts(2, ipv6=True)
    a.drop_port(7003)
    dropped = a.spawn(listen_once, 7003)
    with pytest.raises(simulated.HostCallError, match="timed out"):
        b.spawn(fetch, a.address, 7003, 0.5).result(30)
    with pytest.raises(simulated.HostCallError, match="timed out"):
        b.spawn(fetch, a.address6, 7003, 0.5).result(30)
    dropped.kill()
    server = a.spawn(listen_once, 7004)
    assert b.spawn(fetch, "host0", 7004).result(30) == a.address
    server.result(30)
