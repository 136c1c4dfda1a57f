"""``tfpart worker`` opens no door and nothing hangs on it: a worker accepts connections
only on its cluster address (or says it cannot), Ctrl-C and SIGTERM stop it, and a
frozen task (SIGSTOP: its kernel still accepts TCP connections) ends a run, before or
during it, with one line naming the task. Real processes on loopback, no mocks."""
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.e2e.test_multihost import FAST_LINKS, one_line_error, tfpart
from tfpart.core.cluster import load_cluster
from tfpart.compile import compile_model
from tfpart.core.errors import TfpartError
from tfpart.local_workers import LocalWorkers, free_port, worker_command
from tfpart.servers import (HOOKABLE, STATUS_METHOD, address_filter, check_workers,
                            filtered_from_the_start, listen_only_on, machine_addresses,
                            status_failures)

# about processes, not kernels; one xdist worker starts the module's frozen cluster, once
pytestmark = [pytest.mark.slow, pytest.mark.any_onednn,
              pytest.mark.xdist_group("worker_safety")]
FAULT_LIMIT_S = 30  # from a fault to the exit
COMMAND_LIMIT_S = 60  # a whole command, TensorFlow's start-up on a loaded machine included


# A classic BPF interpreter for the filter's opcodes, so that the program itself is
# checked on crafted IP headers as well as on real sockets below.
def run_filter(program, header):
    a, at = 0, 0
    while True:
        code, jt, jf, k = program[at]
        at += 1
        if code in (0x30, 0x20):  # ld b / ld w at SKF_NET_OFF + offset
            size = 1 if code == 0x30 else 4
            offset = k - 0xFFF00000
            a = int.from_bytes(header[offset:offset + size], "big")
        elif code == 0x74:
            a >>= k
        elif code == 0x15:
            at += jt if a == k else jf
        elif code == 0x05:
            at += k
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


def ip_header(destination):
    address = ipaddress.ip_address(destination)
    if address.version == 4:
        return bytes([0x45]) + bytes(15) + address.packed
    return bytes([0x60]) + bytes(23) + address.packed


@pytest.mark.parametrize("allowed, destination, kept", [
    (["127.0.0.1"], "127.0.0.1", True), (["127.0.0.1"], "127.0.0.2", False),
    (["127.0.0.1"], "::1", False), (["127.0.0.1", "::1"], "::1", True),
    (["127.0.0.1", "::1"], "::2", False), (["fd00::2"], "fd00::2", True),
    (["fd00::2"], "fd00::3", False), (["10.0.0.1", "10.0.0.2"], "10.0.0.2", True)])
def test_the_filter_program_keeps_only_the_allowed_destinations(allowed, destination, kept):
    program = address_filter([ipaddress.ip_address(a) for a in allowed])
    assert bool(run_filter(program, ip_header(destination))) is kept



@pytest.mark.parametrize("before", [
    pytest.param(True, marks=pytest.mark.skipif(not HOOKABLE, reason="no listen() hook here")),
    False])
def test_a_socket_is_filtered_before_it_listens_or_says_it_was_not(before):
    """The hook on a dual-stack socket, as gRPC's, that Python's socket module makes
    listen; and without it, the filter attached after, as the line then says."""
    allowed = [ipaddress.ip_address("127.0.0.1")]
    with socket.socket(socket.AF_INET6) as sock:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", 0))
        port = sock.getsockname()[1]
        with filtered_from_the_start(port, allowed if before else None) as filtered:
            sock.listen()
        line = listen_only_on(port, allowed, None, filtered)
        assert accepts("127.0.0.1", port) and not accepts("127.0.0.2", port, timeout=0.3)
    assert ("on before it listened" in line) is before
    assert ("attached only after it began listening" in line) is not before


def start_worker(tmp_path, host):
    """A ``tfpart worker`` for ``host`` on a free port; returns the process, the port and
    its two start-up lines."""
    port = free_port()
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"cluster": {"worker": [f"{host}:{port}"]}, "devices": [
        {"name": "/job:worker/task:0/device:CPU:0", "kind": "cpu"}]}))
    process = subprocess.Popen(worker_command(path, 0), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    lines = [process.stdout.readline() for _ in range(2)]
    assert all(lines), process.communicate(timeout=30)[1][-3000:]
    return process, port, lines


def accepts(address, port, timeout=1.0):
    try:
        socket.create_connection((address, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def stop(process, how):
    start = time.monotonic()
    process.send_signal(how)
    out, _ = process.communicate(timeout=FAULT_LIMIT_S)
    return out, time.monotonic() - start


@pytest.mark.parametrize("address", ["127.0.0.1:0", "127.0.0.1", "a" * 300 + ":2222"])
def test_an_address_without_a_port_or_with_a_host_no_dns_has_is_refused(address):
    """Port 0 (or none) would serve on a port nobody was told, on every interface (no
    filter can be put on an unknown port): refused before any server is made."""
    from tfpart.core.cluster import cluster_from_dict
    from tfpart.servers import start_server

    cluster = cluster_from_dict({"cluster": {"worker": [address]}, "devices": [
        {"name": "/job:worker/task:0/device:CPU:0", "kind": "cpu"}]}, source="c.json")
    with pytest.raises(TfpartError, match="needs a port from 1 to 65535 and a host of at"):
        start_server(cluster, 0)


def test_a_worker_for_127_0_0_1_accepts_no_other_address_and_sigterm_stops_it(tmp_path):
    process, port, lines = start_worker(tmp_path, "127.0.0.1")
    try:
        assert f"accepting connections to 127.0.0.1 port {port} only" in lines[1]
        assert "no authentication" in lines[1]
        others = ["127.0.0.2", *[a for a in machine_addresses()
                                 if not ipaddress.ip_address(a).is_loopback]]
        assert accepts("127.0.0.1", port)
        refused = {address: not accepts(address, port) for address in others}
        # TensorFlow's own status request: answered on the task's address only
        answers = status_failures([f"127.0.0.1:{port}", f"127.0.0.2:{port}"], 2.0)
    finally:
        out, seconds = stop(process, signal.SIGTERM)
    assert all(refused.values()), refused
    assert answers[0] is None and answers[1][0] == "DEADLINE_EXCEEDED", answers
    assert process.returncode == 0
    assert out.strip().splitlines()[-1] == "tfpart worker: stopped by SIGTERM"
    assert seconds < 5
    print(f"refused on {sorted(refused)}; SIGTERM stopped it in {seconds:.2f} s")


def test_a_worker_on_every_interface_says_so_and_ctrl_c_stops_it(tmp_path):
    process, port, lines = start_worker(tmp_path, "0.0.0.0")
    try:
        assert f"listening on every interface of this machine, port {port} (" in lines[1]
        assert "127.0.0.1" in lines[1] and "no authentication" in lines[1]
        assert accepts("127.0.0.2", port)  # as the line says
    finally:
        out, seconds = stop(process, signal.SIGINT)
    assert process.returncode == 130
    assert out.strip().splitlines()[-1] == "tfpart worker: stopped by SIGINT"
    assert seconds < 5


# A TensorFlow client's first bytes, by hand: HTTP/2's connection preface, then one gRPC
# call with an empty message, its headers as HPACK literals (RFC 7541, 6.2.2).
def http2_frame(kind, flags, stream, payload=b""):
    return (len(payload).to_bytes(3, "big") + bytes([kind, flags])
            + stream.to_bytes(4, "big") + payload)


def grpc_call(method):
    headers = [(":method", "POST"), (":scheme", "http"), (":path", method),
               (":authority", "tfpart"), ("content-type", "application/grpc"),
               ("te", "trailers")]
    block = b"".join(bytes([0, len(name)]) + name.encode() + bytes([len(value)])
                     + value.encode() for name, value in headers)
    return (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + http2_frame(4, 0, 0)  # SETTINGS
            + http2_frame(1, 4, 1, block)  # HEADERS, end of headers
            + http2_frame(0, 1, 1, bytes(5)))  # DATA, end of stream: an empty message


STATUS_CALL = grpc_call(STATUS_METHOD)


def answered(data):
    """Whether ``data``, what a server sent, answers a call: a HEADERS or DATA frame on a
    stream (the connection's own frames, SETTINGS among them, are on stream 0)."""
    at = 0
    while at + 9 <= len(data):
        length, kind = int.from_bytes(data[at:at + 3], "big"), data[at + 3]
        if kind in (0, 1) and int.from_bytes(data[at + 5:at + 9], "big") & 0x7FFFFFFF:
            return True
        at += 9 + length
    return False


def knock(address, port, until):
    """Connect to ``address`` port ``port`` again and again until ``until()``, sending the
    status call on every connection that opens; return how many attempts were refused
    (nothing listening yet) and dropped (no answer to the SYN), and the open connections."""
    refused, dropped, opened = 0, 0, []
    while not until():
        try:
            connection = socket.create_connection((address, port), timeout=0.05)
        except ConnectionRefusedError:
            refused += 1
            time.sleep(0.001)
            continue
        except TimeoutError:
            dropped += 1
            continue
        try:
            connection.sendall(STATUS_CALL)
        except OSError:  # shut already
            pass
        opened.append(connection)
    return refused, dropped, opened


def reply(connection, deadline):
    """What the server sent on ``connection`` until it answered, closed it, or
    ``deadline``; closes it."""
    data = b""
    with connection:
        try:
            while not answered(data):
                connection.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = connection.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:  # reset, or the deadline passed
            pass
    return data


def test_a_worker_accepts_no_other_address_even_while_it_starts(tmp_path):
    """From the moment the worker starts until after it says it serves, a client on
    another local address connects in a tight loop and sends TensorFlow's status call on
    every connection that opens: none ever opens (none is answered), while the task's
    address answers. While the filter went on after listen(), every one of 8 runs had
    connections open there (49 to 1380) and calls answered (1 to 1144)."""
    port = free_port()
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}"]}, "devices": [
        {"name": "/job:worker/task:0/device:CPU:0", "kind": "cpu"}]}))
    with open(tmp_path / "worker.err", "w") as log:
        process = subprocess.Popen(worker_command(path, 0), stdout=subprocess.PIPE,
                                   stderr=log, text=True)
    lines, served = [], []

    def read_start_up():
        lines.extend(process.stdout.readline() for _ in range(2))
        served.append(time.monotonic())
    threading.Thread(target=read_start_up, daemon=True).start()
    give_up = time.monotonic() + COMMAND_LIMIT_S

    def until():  # half a second after the worker says it serves
        return (served and time.monotonic() > served[0] + 0.5
                or time.monotonic() > give_up or process.poll() is not None)
    try:
        refused, dropped, opened = knock("127.0.0.2", port, until)
        deadline = time.monotonic() + 1.0
        replies = [reply(connection, deadline) for connection in opened]
        assert all(lines), (tmp_path / "worker.err").read_text()[-3000:]
        own = socket.create_connection(("127.0.0.1", port), timeout=5)
        own.sendall(STATUS_CALL)
        own_reply = reply(own, time.monotonic() + 5)
    finally:
        stop(process, signal.SIGTERM)
    assert refused and dropped, "the knocking did not span the moment the port listened"
    answers = sum(map(answered, replies))
    assert not opened, f"{len(opened)} connections opened on 127.0.0.2, {answers} answered"
    assert answered(own_reply)
    assert f"accepting connections to 127.0.0.1 port {port} only" in lines[1]
    assert "on before it listened" in lines[1]
    print(f"127.0.0.2 during start-up: {refused} connection attempts refused before the port "
          f"listened, {dropped} dropped after, none opened")


def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_local_workers_do_not_outlive_the_process_that_started_them(tmp_path):
    """A test or notebook that dies without stopping its workers leaves none behind."""
    script = ("import os; from tfpart.local_workers import LocalWorkers; "
              f"workers = LocalWorkers(1, {str(tmp_path)!r}, pin=False); "
              "print(workers.processes[0].pid, flush=True); os._exit(0)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    pid, start = int(done.stdout.split()[-1]), time.monotonic()
    while running(pid):
        assert time.monotonic() - start < FAULT_LIMIT_S, f"worker {pid} outlived its parent"
        time.sleep(0.2)
    log = (tmp_path / "worker-0.log").read_text().strip().splitlines()
    assert log[-1].startswith("tfpart worker: stopped by the exit of process ")
    print(f"orphaned worker stopped {time.monotonic() - start:.1f} s after its parent")


@pytest.fixture(scope="module")
def frozen_cluster(tmp_path_factory, exported):
    """Two workers and a parameter server, and an MLP pipelined over the workers."""
    directory = tmp_path_factory.mktemp("frozen")
    with LocalWorkers(2, directory, links=FAST_LINKS, ps=1) as workers:
        model, out = exported("mlp_module"), directory / "out"
        compile_model(model, workers.path, out, batch_size=16, microbatches=2)
        yield workers, model, out


@pytest.fixture
def frozen(frozen_cluster):
    """Freeze a task for the test, and let it go on after."""
    workers = frozen_cluster[0]
    held = []

    def freeze(task, job="worker"):
        workers.freeze(task, job)
        held.append((task, job))
    yield freeze
    for task, job in held:
        workers.freeze(task, job, frozen=False)


def test_a_healthy_check_of_three_tasks_is_fast(frozen_cluster):
    cluster = load_cluster(frozen_cluster[0].path)
    start = time.monotonic()
    check_workers(cluster)
    first = time.monotonic() - start
    start = time.monotonic()
    check_workers(cluster)
    again = time.monotonic() - start
    assert first < 1.0 and again < 1.0  # milliseconds when the machine is idle
    print(f"healthy check of 3 tasks: {first * 1000:.0f} ms, then {again * 1000:.0f} ms")


@pytest.mark.parametrize("command", ["run", "verify"])
def test_a_frozen_worker_is_named_before_connecting(command, frozen_cluster, frozen):
    workers, model, out = frozen_cluster
    frozen(1)
    args = ["run", out] if command == "run" else ["verify", model, out]
    done, seconds = tfpart(*args, "--cluster", workers.path)
    assert done.returncode == 2, done.stderr[-3000:]
    line = one_line_error(done.stderr)
    assert "worker task 1 at localhost:" in line and "is not responding" in line
    assert f"--cluster {workers.path} --task 1`" in line
    assert seconds < COMMAND_LIMIT_S
    print(f"frozen worker, {command}: exit 2 after {seconds:.1f} s: {line}")


def test_a_frozen_parameter_server_is_named_with_its_job(frozen_cluster, frozen):
    workers = frozen_cluster[0]
    frozen(0, "ps")
    start = time.monotonic()
    with pytest.raises(TfpartError) as error:
        check_workers(load_cluster(workers.path))
    assert "ps task 0 at localhost:" in str(error.value)
    assert f"`tfpart worker --cluster {workers.path} --job ps --task 0`" in str(error.value)
    assert time.monotonic() - start < 10


def connections(pid, port):
    """How many established TCP connections process ``pid`` has to local ``port``."""
    inodes = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()  # remote address:port, state (01: established), inode
                remote, state, inode = int(fields[2].split(":")[1], 16), fields[3], fields[9]
                count += remote == port and state == "01" and inode in inodes
    return count


def test_a_worker_frozen_mid_run_ends_the_run(frozen_cluster, frozen):
    workers, _, out = frozen_cluster
    port = int(load_cluster(workers.path).tf_cluster["worker"][1].rsplit(":", 1)[1])
    run = subprocess.Popen([sys.executable, "-m", "tfpart.cli", "run", str(out),
                            "--cluster", str(workers.path), "--repeats", "10000000"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        start = time.monotonic()
        # the status check's connection and TensorFlow's own: connected, watched, running
        while connections(run.pid, port) < 2:
            assert run.poll() is None, run.communicate()
            assert time.monotonic() - start < COMMAND_LIMIT_S * 2, "the run never connected"
            time.sleep(0.2)
        time.sleep(3)
        assert run.poll() is None, run.communicate()
        frozen(1)
        start = time.monotonic()
        _, stderr = run.communicate(timeout=FAULT_LIMIT_S)
        seconds = time.monotonic() - start
    finally:
        run.kill()
    assert run.returncode == 2
    line = one_line_error(stderr)
    assert "worker task 1" in line and "is not responding" in line
    assert "(lost while running)" in line
    assert seconds < FAULT_LIMIT_S
    print(f"worker frozen mid-run: exit 2 {seconds:.1f} s after SIGSTOP: {line}")
