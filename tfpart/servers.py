"""TensorFlow servers: starting a task's ``tf.distribute.Server`` so that it accepts
connections only on the address the cluster file gives it, stopping it on a signal,
checking and watching the tasks of a cluster with a status request that a frozen task
cannot answer, connecting this process to them as a client, and turning a cluster's
failures into one-line errors that name the lost task.

TensorFlow binds every server to every interface: ``GrpcServer::Init``
(``tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc``) calls
``builder.AddListeningPort(strings::StrCat("0.0.0.0:", requested_port), ...)``, taking
only the port from the cluster spec (or ``ServerDef.port``), and gRPC turns ``0.0.0.0``
into a dual-stack ``[::]`` socket (``*:PORT`` in ``ss -ltn``). No option, environment
variable or ``ServerDef`` field changes the host. So on Linux a worker attaches a
classic BPF socket filter to that listening socket, which drops every packet (the
handshake's SYN and its last ACK among them) addressed to another of the machine's
addresses; the filter is inherited by the accepted connections. A task whose cluster
address cannot be matched safely (a host name, a wildcard, an address not on this
machine) keeps listening everywhere, and says so when it starts.

The filter is on the socket before it listens. gRPC starts accepting connections, and
reading the calls sent on them, the moment it listens, inside the server's constructor
and long before ``start()``; once started, TensorFlow serves every call read by then,
even one whose connection was closed meanwhile (measured with TensorFlow 2.21: a
session was created, after ``start()``, from a connection shut and closed before it).
A filter attached after ``listen()`` therefore leaves a window that no draining of the
accept queue or shutting of connections closes. So while the server is created, the
loaded libraries' calls to ``listen()``, which go through their global offset tables,
go first to a function that attaches the filter to a socket on the task's port: it
never listens unfiltered, and no connection to another address is ever accepted.
Where that cannot be done (not 64-bit x86 or Arm Linux, or a listening socket the hook
did not see), the filter is attached just after, and the task says it had that window.
"""
from __future__ import annotations

import ctypes
import ipaddress
import mmap
import os
import re
import platform
import signal
import socket
import struct
import sys
import threading
import time
from contextlib import contextmanager

from rewriters.tf_import import tensorflow
from tfpart.core.errors import TfpartError, first_line
from tfpart.core.quiet import to_library_log

connected = False  # set once this process is a client of a cluster (see connect)
STATUS_METHOD = "/tensorflow.WorkerService/GetStatus"  # answered on the task's inter-op pool
MAX_HOST_CHARS = 253  # the longest DNS name
CHECK_TIMEOUT_S = 3.0  # a task that answers no status request within this is not responding
# During a run the task's inter-op threads are busy: answers took up to 1 s on a loaded
# 2-core machine (load 16), and one op may hold a task's only inter-op thread longer.
WATCH_TIMEOUT_S = 10.0
UNAUTHENTICATED = ("TensorFlow's runtime runs any graph a peer sends, with no "
                   "authentication: keep this port on a trusted network")

def set_threads(intra=None, inter=None):
    """Threads TensorFlow may use in this process (before it starts)."""
    tf = tensorflow()
    if intra:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
    if inter:
        tf.config.threading.set_inter_op_parallelism_threads(inter)

def cluster_spec(cluster):
    tf = tensorflow()
    if not cluster.tf_cluster:
        raise TfpartError(cluster.source, "has no 'cluster' block (job -> task addresses)")
    return tf.train.ClusterSpec(cluster.tf_cluster)

def start_server(cluster, task, job=None, intra_threads=None, inter_threads=None):
    """Start this task's ``tf.distribute.Server`` for ``cluster``, accepting connections
    only on its cluster address where that can be done (see the module docstring).

    Returns
    -------
    server : tf.distribute.Server
    exposure : str
        One line: where the task accepts connections, and that TensorFlow
        authenticates none of them.
    """
    tf = tensorflow()
    spec = cluster_spec(cluster)
    job = job or ("worker" if "worker" in cluster.tf_cluster else sorted(cluster.tf_cluster)[0])
    if job not in cluster.tf_cluster or not 0 <= task < len(cluster.tf_cluster[job]):
        raise TfpartError(cluster.source, f"has no task {task} in job {job!r}")
    address = cluster.tf_cluster[job][task]
    host, port = _split_address(address)
    if not 0 < port < 65536 or len(host) > MAX_HOST_CHARS:
        raise TfpartError(cluster.source, f"{job} task {task}'s address "
                          f"{address[:60]}{'…' if len(address) > 60 else ''} needs a port "
                          f"from 1 to 65535 and a host of at most {MAX_HOST_CHARS} "
                          "characters (port 0 would serve on a port nobody was told)")
    _check_port_free(cluster, job, task, address)
    addresses, why_not = accepted_addresses(host)
    if addresses is not None and not sys.platform.startswith("linux"):
        addresses, why_not = None, "socket filters are Linux-only"
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra_threads or 0,
                                      inter_op_parallelism_threads=inter_threads or 0)
    try:
        # The constructor listens, and gRPC accepts from then on: the filter goes on
        # before (see the module docstring)
        with filtered_from_the_start(port, addresses) as filtered:
            server = tf.distribute.Server(spec, job_name=job, task_index=task,
                                          config=config, start=False)
    except (tf.errors.OpError, ValueError) as exc:
        raise TfpartError(cluster.source, f"cannot start {job} task {task} at "
                          f"{address}: {first_line(exc)}") from None
    exposure = listen_only_on(port, addresses, why_not, filtered)
    server.start()
    return server, exposure

def _split_address(address):
    """(host, port) of ``host:port``; port 0 where it gives none.

    >>> _split_address("[::1]:2222"), _split_address("localhost")
    (('::1', 2222), ('localhost', 0))
    """
    host, _, port = address.rpartition(":")
    number = int(port) if re.fullmatch("[0-9]{1,5}", port) else 0
    return host.strip("[]") or "localhost", number

def _check_port_free(cluster, job, task, address):
    """Refuse a port that something listens on: gRPC may share it with another server
    (SO_REUSEPORT). Checked on the wildcard address, which TensorFlow binds whatever
    the host (an address behind NAT, not on this machine, included)."""
    port = _split_address(address)[1]
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)  # dual-stack, as gRPC's
    except OSError:  # no IPv6 here
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with probe:
        # as gRPC does: a connection in TIME_WAIT is no conflict, a listener is
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as exc:
            raise TfpartError(cluster.source, f"cannot start {job} task {task}: port {port} "
                              f"of {address} is already in use ({exc.strerror})") from None

# Listening only where the cluster file says ----------------------------------------

WILDCARD_HOSTS = ("", "0.0.0.0", "::", "*")
LOOPBACKS = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))

def accepted_addresses(host):
    """The local addresses a task whose cluster address names ``host`` should accept
    connections on, and why not when it cannot be limited safely.

    Only IP addresses of this machine and ``localhost`` are matched: another machine
    may resolve a host name to another address than this one does (Debian maps the
    machine's own name to 127.0.1.1), and an address not on this machine (behind NAT)
    arrives rewritten to one that is.

    Returns
    -------
    addresses : tuple of ipaddress objects, or None
    why_not : str or None
        Why the task listens everywhere, when ``addresses`` is None.

    Examples
    --------
    >>> accepted_addresses("localhost")
    ((IPv4Address('127.0.0.1'), IPv6Address('::1')), None)
    >>> accepted_addresses("127.0.0.1")
    ((IPv4Address('127.0.0.1'),), None)
    >>> accepted_addresses("0.0.0.0")[1]
    'the cluster file gives the wildcard address 0.0.0.0'
    >>> accepted_addresses("192.0.2.77")[1]  # TEST-NET-1: not on this machine
    '192.0.2.77 is not an address of this machine'
    """
    if host in WILDCARD_HOSTS:
        return None, f"the cluster file gives the wildcard address {host or '(none)'}"
    if host == "localhost":
        return LOOPBACKS, None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None, (f"the cluster file gives the host name {host}, which other machines "
                      "may resolve to another address (give the task's IP address to "
                      "accept connections on it alone)")
    if not _is_local(address):
        return None, f"{host} is not an address of this machine"
    return (address,), None

def _is_local(address):
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(address), 0))
            return True
        except OSError:
            return False

# Classic BPF (linux/filter.h): a program run on every packet the socket receives,
# returning the bytes to keep (0: drop). Loads at SKF_NET_OFF + k read the IP header.
SO_ATTACH_FILTER = 26
SKF_NET_OFF = 0xFFF00000  # -0x100000 as an unsigned 32-bit offset
LD_B, LD_W, RSH, JEQ, JA, RET = 0x30, 0x20, 0x74, 0x15, 0x05, 0x06
ACCEPT = 0xFFFFFFFF

def address_filter(addresses):
    """A classic BPF program that keeps the packets whose IP destination is one of
    ``addresses`` (IPv4 or IPv6) and drops every other.

    Returns
    -------
    list of (code, jt, jf, k)
        ``struct sock_filter`` instructions, jumps resolved.

    Examples
    --------
    >>> program = address_filter([ipaddress.ip_address("127.0.0.1")])
    >>> program[-2:]  # drop, accept
    [(6, 0, 0, 0), (6, 0, 0, 4294967295)]
    >>> program[4:6]  # load the IPv4 destination; if 127.0.0.1, jump two on to accept
    [(32, 0, 0, 4293918736), (21, 2, 0, 2130706433)]
    """
    v4 = [a for a in addresses if a.version == 4]
    v6 = [a for a in addresses if a.version == 6]
    code = [(LD_B, 0, 0, SKF_NET_OFF), (RSH, 0, 0, 4),  # the IP version
            (JEQ, "v4", "not v4", 4), "not v4", (JEQ, "v6", "drop", 6),
            "v4", (LD_W, 0, 0, SKF_NET_OFF + 16)]  # IPv4 destination
    code += [(JEQ, "accept", 0, int(a)) for a in v4]
    code += [(JA, 0, 0, "drop"), "v6"]
    for n, address in enumerate(v6):  # IPv6 destination: four words from byte 24
        for w, word in enumerate(struct.unpack("!4I", address.packed)):
            code += [(LD_W, 0, 0, SKF_NET_OFF + 24 + 4 * w), (JEQ, 0, f"not {n}", word)]
        code += [(JA, 0, 0, "accept"), f"not {n}"]
    code += ["drop", (RET, 0, 0, 0), "accept", (RET, 0, 0, ACCEPT)]
    return _resolve_jumps(code)

def _resolve_jumps(code):
    """Instructions and string labels in, instructions with relative jumps out."""
    labels, program = {}, []
    for item in code:
        if isinstance(item, str):
            labels[item] = len(program)
        else:
            program.append(item)

    def offset(target, at):
        return labels[target] - at - 1 if isinstance(target, str) else target
    return [(op, offset(jt, at), offset(jf, at), offset(k, at) if op == JA else k)
            for at, (op, jt, jf, k) in enumerate(program)]

def listen_only_on(port, addresses, why_not, filtered=()):
    """Make this process's listening sockets on ``port`` accept connections only to
    ``addresses`` (None: that cannot be done, for the reason ``why_not``); return the line
    that says what is exposed. A socket not in ``filtered`` (inode numbers of sockets
    filtered before they listened, by :func:`filtered_from_the_start`) gets the filter
    now, its connections to other addresses are shut, and the line says so."""
    late = False
    if addresses is not None:
        try:
            late = _filter_port(port, addresses, filtered)
        except OSError as exc:
            addresses, why_not = None, f"the socket filter failed ({exc.strerror or exc})"
    if addresses is None:
        listed = ", ".join(machine_addresses()) or "every address"
        return (f"listening on every interface of this machine, port {port} ({listed}): "
                f"{why_not}; {UNAUTHENTICATED}")
    how = ("a socket filter drops the rest, attached only after it began listening: a "
           "call sent to another address in that moment may still be served" if late else
           "a socket filter, on before it listened, drops the rest")
    return (f"accepting connections to {' and '.join(map(str, addresses))} port {port} only "
            f"(TensorFlow listens on every interface; {how}); {UNAUTHENTICATED}")

def _filter_port(port, addresses, filtered=()):
    """Attach the filter to this process's listening sockets on ``port`` that are not in
    ``filtered``, and shut the connections to other addresses; return whether any
    socket needed it."""
    sockets = _tcp_sockets_on(port)
    try:
        listening = [s for s in sockets if s.getsockopt(socket.SOL_SOCKET,
                                                         socket.SO_ACCEPTCONN)]
        if not listening:
            raise OSError(f"no listening socket on port {port} in this process")
        late = [s for s in listening if os.fstat(s.fileno()).st_ino not in filtered]
        for sock in late:
            attach_filter(sock, addresses)
        for sock in sockets:
            if sock not in listening and _local_address(sock) not in addresses:
                sock.shutdown(socket.SHUT_RDWR)
        return bool(late)
    finally:
        for sock in sockets:
            sock.close()

def attach_filter(sock, addresses):
    """Attach :func:`address_filter`'s program for ``addresses`` to ``sock`` (Linux)."""
    instructions = b"".join(struct.pack("@HBBI", *i) for i in address_filter(addresses))
    buffer = ctypes.create_string_buffer(instructions, len(instructions))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                    struct.pack("@HP", len(instructions) // 8, ctypes.addressof(buffer)))

# The filter before listen() -------------------------------------------------------
# ELF (elf.h): a loaded object's dynamic section lists its relocations; those that name
# an imported function give the global offset table entry its calls jump through.

HOOKABLE = (sys.platform.startswith("linux") and sys.maxsize > 2**32
            and platform.machine() in ("x86_64", "aarch64"))  # 64-bit ELF, RELA relocations
PT_DYNAMIC = 2
DT_PLTRELSZ, DT_STRTAB, DT_SYMTAB, DT_RELA, DT_RELASZ, DT_PLTREL, DT_JMPREL = 2, 5, 6, 7, 8, 20, 23
POINTER_TAGS = (DT_STRTAB, DT_SYMTAB, DT_RELA, DT_JMPREL)

class _ProgramHeader(ctypes.Structure):  # Elf64_Phdr
    _fields_ = [("type", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("offset", ctypes.c_uint64), ("address", ctypes.c_uint64),
                ("physical_address", ctypes.c_uint64), ("file_size", ctypes.c_uint64),
                ("memory_size", ctypes.c_uint64), ("alignment", ctypes.c_uint64)]

class _LoadedObject(ctypes.Structure):  # the start of struct dl_phdr_info (link.h)
    _fields_ = [("base", ctypes.c_uint64), ("name", ctypes.c_char_p),
                ("headers", ctypes.POINTER(_ProgramHeader)), ("header_count", ctypes.c_uint16)]

_VISIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_LoadedObject), ctypes.c_size_t,
                          ctypes.c_void_p)
_LISTEN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, use_errno=True)
_hooks = []  # every hook made, kept for ever: another thread may be inside one after its block

@contextmanager
def filtered_from_the_start(port, addresses):
    """While in the block, a socket of this process that begins to listen on ``port``
    gets the filter for ``addresses`` just before (nothing when ``addresses`` is None);
    yields the set of those sockets' inode numbers, filled as they listen.

    The loaded libraries' calls to ``listen()`` go to a hook meanwhile (their global
    offset table entries point at it). Where that cannot be done, the set stays empty,
    and :func:`listen_only_on` attaches the filter late and says so.

    Examples
    --------
    >>> with socket.socket() as sock:
    ...     sock.bind(("127.0.0.1", 0))
    ...     port = sock.getsockname()[1]
    ...     with filtered_from_the_start(port, LOOPBACKS[:1]) as filtered:
    ...         sock.listen()  # Python's socket module calls listen() as TensorFlow does
    ...     os.fstat(sock.fileno()).st_ino in filtered or not HOOKABLE
    True
    """
    filtered = set()
    if addresses is None or not HOOKABLE:
        yield filtered
        return
    libc = ctypes.CDLL(None, use_errno=True)  # its listen(), found by name, is not hooked

    def listen(fd, backlog):
        try:
            with _duplicate(fd) as sock:
                if (sock.family in (socket.AF_INET, socket.AF_INET6)
                        and sock.type == socket.SOCK_STREAM and sock.getsockname()[1] == port):
                    attach_filter(sock, addresses)
                    filtered.add(os.fstat(fd).st_ino)
        except BaseException:  # noqa: BLE001 -- nothing may stop listen(), nor be raised
            pass  # into C; listen_only_on filters the socket missed here
        return libc.listen(fd, backlog)
    hook = _LISTEN(listen)
    _hooks.append(hook)
    with _calls_redirected(b"listen", ctypes.cast(hook, ctypes.c_void_p).value):
        yield filtered

def _duplicate(fd):
    """A socket object on a duplicate of descriptor ``fd``."""
    copy = os.dup(fd)
    try:
        return socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        raise

@contextmanager
def _calls_redirected(symbol, function):
    """Point the global offset table entries through which the loaded ELF objects call
    the function named ``symbol`` (bytes) at address ``function`` while in the block;
    none where they cannot be found or written."""
    try:
        slots = _got_slots(symbol)
    except Exception:  # noqa: BLE001 -- an object unlike the usual: the filter is then
        slots = []  # attached late instead, and the task says so (listen_only_on)
    changed = []
    for slot in slots:
        try:
            changed.append((slot, _write_pointer(slot, function)))
        except OSError:
            pass
    try:
        yield
    finally:
        for slot, original in reversed(changed):
            try:
                _write_pointer(slot, original)
            except OSError:  # left on the hook, which goes on calling listen()
                pass

def _got_slots(symbol):
    """Addresses of the global offset table entries through which the loaded ELF objects
    call the function named ``symbol`` (bytes), from their RELA relocations.

    >>> len(_got_slots(b"listen")) > 0 or not HOOKABLE  # Python's socket module's
    True
    """
    import numpy as np

    symbol_type = np.dtype([("name", "u4"), ("info", "u1"), ("other", "u1"),
                            ("section", "u2"), ("value", "u8"), ("size", "u8")])
    rela_type = np.dtype([("offset", "u8"), ("info", "u8"), ("addend", "i8")])
    slots = []
    for base, tags in _dynamic_sections():
        spans = [(DT_RELA, DT_RELASZ)]
        if tags.get(DT_PLTREL) == DT_RELA:  # the calls' own relocations
            spans.append((DT_JMPREL, DT_PLTRELSZ))
        tables = [_array(tags[at], tags[size], rela_type) for at, size in spans
                  if tags.get(at) and tags.get(size)]
        if not tables or not tags.get(DT_SYMTAB) or not tags.get(DT_STRTAB):
            continue
        indices = [table["info"] >> np.uint64(32) for table in tables]  # ELF64_R_SYM
        used = np.zeros(max(int(index.max()) for index in indices) + 1, bool)
        for index in indices:
            used[index] = True
        symbols = _array(tags[DT_SYMTAB], symbol_type.itemsize * len(used), symbol_type)
        imported = np.flatnonzero(used & (symbols["section"] == 0))  # SHN_UNDEF
        wanted = [i for i in imported[imported > 0] if ctypes.string_at(
            tags[DT_STRTAB] + int(symbols["name"][i])) == symbol]
        for table, index in zip(tables, indices):
            slots += [base + int(offset) for offset in table["offset"][np.isin(index, wanted)]]
    return slots

def _dynamic_sections():
    """(load address, dynamic section entries by tag) of each loaded ELF object, its
    pointers as addresses (ld.so relocates them in place on most platforms, not all)."""
    found = []

    def visit(info, size, data):
        loaded = info.contents
        found.extend((loaded.base, loaded.base + loaded.headers[i].address)
                     for i in range(loaded.header_count) if loaded.headers[i].type == PT_DYNAMIC)
        return 0
    ctypes.CDLL(None).dl_iterate_phdr(_VISIT(visit), None)
    sections = []
    for base, at in found:
        tags = {}
        while True:
            tag, value = struct.unpack("@qQ", ctypes.string_at(at, 16))
            if tag == 0:  # DT_NULL
                break
            tags.setdefault(tag, value + base if tag in POINTER_TAGS and value < base else value)
            at += 16
        sections.append((base, tags))
    return sections

def _array(address, size, dtype):
    """``size`` bytes of this process's memory from ``address``, as a numpy array (no copy)."""
    import numpy as np

    return np.frombuffer((ctypes.c_char * size).from_address(address), dtype=dtype)

def _write_pointer(address, value):
    """Store pointer ``value`` at ``address``, lifting a read-only page's protection for
    the while (a relocation read-only segment); return the pointer it held."""
    cell = ctypes.c_void_p.from_address(address)
    original = cell.value
    if _writable(address):
        cell.value = value
        return original
    _protect(address, mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        cell.value = value
    finally:
        _protect(address, mmap.PROT_READ)
    return original

def _writable(address):
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, permissions = line.split()[:2]
            start, end = (int(bound, 16) for bound in span.split("-"))
            if start <= address < end:
                return "w" in permissions
    raise OSError(f"address {address:#x} is not mapped")

def _protect(address, protection):
    libc = ctypes.CDLL(None, use_errno=True)
    page = address - address % mmap.PAGESIZE
    if libc.mprotect(ctypes.c_void_p(page), ctypes.c_size_t(mmap.PAGESIZE), protection):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))

def _tcp_sockets_on(port):
    """This process's TCP sockets on local ``port``, as duplicates of its descriptors
    (closing them closes nothing else)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = _duplicate(int(name))
        except OSError:  # closed meanwhile
            continue
        try:
            ours = (sock.family in (socket.AF_INET, socket.AF_INET6)
                    and sock.type == socket.SOCK_STREAM and sock.getsockname()[1] == port)
        except OSError:
            ours = False
        if ours:
            found.append(sock)
        else:
            sock.close()
    return found

def _local_address(sock):
    address = ipaddress.ip_address(sock.getsockname()[0].split("%")[0])
    return getattr(address, "ipv4_mapped", None) or address

def machine_addresses():
    """This machine's interface addresses, IPv4 then IPv6 (Linux; empty elsewhere).

    >>> "127.0.0.1" in machine_addresses() or not sys.platform.startswith("linux")
    True
    """
    if not sys.platform.startswith("linux"):
        return []
    import fcntl

    ifreq, count = 40, 256  # sizeof(struct ifreq) on 64-bit Linux
    buffer = ctypes.create_string_buffer(ifreq * count)
    request = struct.pack("@iP", len(buffer), ctypes.addressof(buffer))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            length = struct.unpack("@iP", fcntl.ioctl(sock.fileno(), 0x8912,  # SIOCGIFCONF
                                                      request))[0]
        v4 = [socket.inet_ntoa(buffer.raw[at + 20:at + 24]) for at in range(0, length, ifreq)]
    except OSError:
        v4 = []
    try:
        with open("/proc/net/if_inet6") as table:
            v6 = [str(ipaddress.ip_address(bytes.fromhex(line.split()[0])))
                  for line in table if line.strip()]
    except OSError:
        v6 = []
    return list(dict.fromkeys(v4 + v6))

class StopSignals:
    """SIGINT and SIGTERM, caught from creation on; :meth:`wait` blocks until one comes.

    A server's ``join()`` would block in C++, where Python never sees Ctrl-C, and
    TensorFlow cannot stop a started server: the caller ends the process with
    ``os._exit`` once :meth:`wait` returns. Create it before telling anyone the task is
    up, so that a signal sent at once is not lost.

    >>> import threading
    >>> stop = StopSignals()
    >>> threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    >>> stop.wait()
    ('SIGTERM', 0)
    >>> StopSignals().wait(parent=-1)  # not this process's parent
    ('the exit of process -1, which started it', 0)
    """

    def __init__(self):
        self.received = []
        self.handlers = {number: signal.signal(number, self._note)
                         for number in (signal.SIGINT, signal.SIGTERM)}

    def _note(self, number, frame):
        self.received.append(number)

    def wait(self, poll=0.2, parent=None):
        """Block until a signal came, or until process ``parent`` is no longer this
        one's parent (it exited); return what stopped it and the exit code for it
        (130 for SIGINT, as shells report Ctrl-C; 0 for SIGTERM, a stop asked for, and
        for a parent's exit). Restores the handlers before. The poll covers a signal
        handled while one of TensorFlow's threads had it."""
        try:
            while not self.received:
                if parent is not None and os.getppid() != parent:
                    return f"the exit of process {parent}, which started it", 0
                time.sleep(poll)
        finally:
            for number, handler in self.handlers.items():
                signal.signal(number, handler)
        first = self.received[0]
        return signal.Signals(first).name, 130 if first == signal.SIGINT else 0

# Checking and watching the tasks ---------------------------------------------------

def task_addresses(cluster):
    """(job, task, address) of every task in the cluster block."""
    return [(job, task, address) for job, addresses in sorted(cluster.tf_cluster.items())
            for task, address in enumerate(addresses)]

_channels = {}  # address -> gRPC channel, reused by every check (a watch asks often)
_channels_lock = threading.Lock()

def _status_call(address):
    import grpc  # a dependency of TensorFlow

    with _channels_lock:
        if address not in _channels:
            _channels[address] = grpc.insecure_channel(address)
        # GetStatusRequest has no fields, so the request is b""; the reply is not read.
        return _channels[address].unary_unary(STATUS_METHOD, request_serializer=bytes,
                                              response_deserializer=bytes)

def status_failures(addresses, timeout):
    """Send TensorFlow's worker status request to every address at once; return, for
    each, None if it answered within ``timeout`` seconds, else the gRPC status code's
    name and details."""
    import grpc

    calls = [_status_call(address).future(b"", timeout=timeout) for address in addresses]
    failures = []
    for address, call in zip(addresses, calls):
        try:
            call.result()
            failures.append(None)
        except grpc.RpcError as exc:
            failures.append((exc.code().name, exc.details() or ""))
            _forget_channel(address)  # a task started again is not held back by its backoff
    return failures

def _forget_channel(address):
    with _channels_lock:
        channel = _channels.pop(address, None)
    if channel is not None:
        channel.close()

def lost_task_message(job, task, address, code, details, timeout, source):
    """The one-line error for a task that failed its status request.

    >>> lost_task_message("ps", 0, "h:2222", "UNAVAILABLE", "failed to connect to all "
    ...                   "addresses; last error: UNKNOWN: ipv4:10.0.0.1:2222: Failed to "
    ...                   "connect to remote host: Connection refused", 3.0, "c.json")
    'ps task 0 at h:2222 is not reachable (Connection refused); start it with `tfpart worker --cluster c.json --job ps --task 0`'
    >>> lost_task_message("worker", 1, "h:2223", "DEADLINE_EXCEEDED", "", 3.0, "c.json")
    'worker task 1 at h:2223 is not responding (no answer to a TensorFlow status request within 3 s: stopped, frozen or cut off); restart it with `tfpart worker --cluster c.json --task 1`'
    """
    command = (f"tfpart worker --cluster {source}" + (f" --job {job}" if job != "worker"
                                                      else "") + f" --task {task}")
    where = f"{job} task {task} at {address}"
    if code == "DEADLINE_EXCEEDED":
        return (f"{where} is not responding (no answer to a TensorFlow status request "
                f"within {timeout:g} s: stopped, frozen or cut off); restart it with "
                f"`{command}`")
    gist = details.rsplit(": ", 1)[-1].strip() or code
    if code == "UNAVAILABLE":
        return f"{where} is not reachable ({gist}); start it with `{command}`"
    return (f"{where} does not answer as a TensorFlow server ({code}: {gist}); start it "
            f"with `{command}`")

def check_workers(cluster, timeout=CHECK_TIMEOUT_S):
    """Fail with a one-line error naming the first task that does not answer a
    TensorFlow status request within ``timeout`` seconds: not reachable (nothing
    listens there) or not responding (stopped, frozen or cut off: the kernel of a
    stopped process still accepts TCP connections, so connecting proves nothing). All
    tasks are asked at once: a healthy cluster answers in milliseconds."""
    tasks = task_addresses(cluster)
    failures = status_failures([address for _, _, address in tasks], timeout)
    for (job, task, address), failure in zip(tasks, failures):
        if failure is not None:
            raise TfpartError(cluster.source, lost_task_message(
                job, task, address, *failure, timeout, cluster.source))

def watch_workers(cluster, interval=0.5, on_lost=None, timeout=WATCH_TIMEOUT_S):
    """Check the tasks every ``interval`` seconds in a daemon thread; when one fails
    (:func:`check_workers`, ``timeout``), call ``on_lost(message)`` (default: print the
    one-line error and exit with code 2, since a TensorFlow call waiting on a dead or
    frozen worker may not return for minutes).

    A task answers the status request on its inter-op threads, so ``timeout`` must
    exceed the longest single op it runs when it has one such thread (10 s by
    default)."""
    def default(message):
        from tfpart.core.quiet import user_stderr

        print(f"tfpart: error: {message}", file=user_stderr(), flush=True)
        os._exit(2)

    def loop():
        while True:
            time.sleep(interval)
            try:
                check_workers(cluster, timeout=timeout)
            except TfpartError as exc:
                (on_lost or default)(f"{exc} (lost while running)")
                return

    thread = threading.Thread(target=loop, name="tfpart-worker-watch", daemon=True)
    thread.start()
    return thread

@contextmanager
def cluster_errors(cluster):
    """Turn TensorFlow's errors from a run across ``cluster`` into one-line errors that
    name the task that went away, when one did."""
    tf = tensorflow()
    try:
        yield
    except tf.errors.OpError as exc:
        if cluster is None:
            raise
        to_library_log(f"tfpart: the run across the cluster failed:\n{exc}")
        _name_a_lost_task(cluster)
        raise TfpartError(cluster.source, "the run across the cluster failed: "
                          f"{first_line(exc)}") from None

def _name_a_lost_task(cluster, wait=2.0, interval=0.2):
    """Raise check_workers' error naming a task that failed within ``wait`` seconds: a
    killed task's connections can reset before the kernel has closed its listening
    port, so a single check may still find it up."""
    deadline = time.monotonic() + wait
    while True:
        check_workers(cluster)
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)

def connect(cluster, watch=False):
    """Make this process a client of ``cluster``'s TensorFlow servers, after checking
    that every task is up; with ``watch``, exit cleanly if one goes away later."""
    global connected  # process-wide, as TensorFlow's own context is
    check_workers(cluster)
    if watch:  # before connecting: TensorFlow's connect waits for ever on a frozen task
        watch_workers(cluster)
    tensorflow().config.experimental_connect_to_cluster(cluster_spec(cluster))
    connected = True
