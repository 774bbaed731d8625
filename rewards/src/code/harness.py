# HumanEval-style check, run inside the sandbox as `python3 -I -S -B harness.py RESULT_FD ENTRY`.
#
# The untrusted program never shares a process with the check. After fork:
#   * the worker (child) closes RESULT_FD, runs program.py and then only answers calls by name,
#     returning plain data encoded with `marshal` (exact builtin types only, so objects with a
#     forged __eq__ cannot cross);
#   * the checker (parent) runs test_code.py with `candidate` and every other unknown global
#     (helpers such as `poly` or `encode_cyclic` that the tests take from the program) bound to
#     call proxies, and writes PASS to RESULT_FD only after `check(candidate)` returned.
# The checker makes itself non-dumpable first, so the worker (same uid) cannot ptrace it or
# write to its memory; /proc is outside the sandbox's Landlock rules. `sys.exit`, `os._exit`,
# patched builtins or a killed parent in the worker can only make the check fail.
import builtins
import marshal
import os
import struct
import sys

RESULT_FD = int(sys.argv[1])
ENTRY = sys.argv[2]
PLAIN = (type(None), bool, int, float, complex, str, bytes)


def send(fd, obj):
    data = marshal.dumps(obj)
    data = struct.pack("<Q", len(data)) + data
    while data:
        n = os.write(fd, data)
        data = data[n:]


def recv_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("worker exited")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(fd):
    (n,) = struct.unpack("<Q", recv_exact(fd, 8))
    return marshal.loads(recv_exact(fd, n))


def plain(value):
    t = type(value)
    if t in PLAIN:
        return True
    if t in (list, tuple, set, frozenset):
        return all(plain(v) for v in value)
    if t is dict:
        return all(plain(k) and plain(v) for k, v in value.items())
    return False


def worker(req_fd, resp_fd):
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        with open("program.py") as f:
            source = f.read()
        exec(compile(source, "program.py", "exec"), namespace)
    except BaseException as e:  # the program failed to load: report and stop
        send(resp_fd, ("dead", type(e).__name__ + ": " + str(e)[:500]))
        os._exit(1)
    send(resp_fd, ("ready",))
    while True:
        try:
            request = recv(req_fd)
        except EOFError:
            os._exit(0)
        try:
            if request[0] == "get":
                value = namespace[request[1]]
                if type(value) is type(os):
                    reply = ("module", value.__name__)
                elif callable(value):
                    reply = ("callable",)
                else:
                    reply = ("value", value)
            else:
                _, name, args, kwargs = request
                reply = ("value", namespace[name](*args, **kwargs))
            data = marshal.dumps(reply)
        except KeyError as e:
            data = marshal.dumps(("error", "NameError", "name %s is not defined" % e))
        except BaseException as e:
            data = marshal.dumps(("error", type(e).__name__, str(e)[:500]))
        os.write(resp_fd, struct.pack("<Q", len(data)) + data)


class Remote:
    """A callable standing for a function defined by the program."""

    def __init__(self, channel, name):
        self.channel = channel
        self.name = name

    def __call__(self, *args, **kwargs):
        return self.channel.ask(("call", self.name, args, kwargs))


class Channel:
    def __init__(self, req_fd, resp_fd):
        self.req_fd = req_fd
        self.resp_fd = resp_fd

    def ask(self, request):
        send(self.req_fd, request)
        reply = recv(self.resp_fd)
        if not plain(reply) or type(reply) is not tuple or not reply:
            raise RuntimeError("malformed reply from the program")
        if reply[0] == "value":
            return reply[1]
        if reply[0] == "callable":
            return Remote(self, request[1])
        if reply[0] == "module":
            return __import__(reply[1])
        if reply[0] == "error":
            exc = getattr(builtins, reply[1], None)
            if isinstance(exc, type) and issubclass(exc, Exception):
                raise exc(reply[2])
            raise RuntimeError(reply[1] + ": " + reply[2])
        raise RuntimeError("malformed reply from the program")


class Globals(dict):
    """Test-code globals: builtins first, then names the program defines (via the worker)."""

    def __init__(self, channel):
        super().__init__()
        self.channel = channel

    def __missing__(self, name):
        if hasattr(builtins, name):
            return getattr(builtins, name)
        value = self.channel.ask(("get", name))
        self[name] = value
        return value


def make_undumpable():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_DUMPABLE = 4
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


def main():
    # The tests are read only after the fork, from a descriptor the worker closes, and the file is
    # unlinked first: the program can neither open test_code.py nor find its text in memory.
    test_fd = os.open("test_code.py", os.O_RDONLY | os.O_CLOEXEC)
    os.unlink("test_code.py")
    make_undumpable()
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(test_fd)
        os.close(RESULT_FD)
        os.close(req_w)
        os.close(resp_r)
        worker(req_r, resp_w)
        os._exit(0)
    os.close(req_r)
    os.close(resp_w)
    with os.fdopen(test_fd, "r") as f:
        test_source = f.read()
    channel = Channel(req_w, resp_r)
    hello = recv(resp_r)
    if hello != ("ready",):
        sys.stderr.write("program failed: %r\n" % (hello,))
        os._exit(3)
    g = Globals(channel)
    g["__name__"] = "__check__"
    exec(compile(test_source, "test_code.py", "exec"), g)
    g["check"](Remote(channel, ENTRY))
    os.write(RESULT_FD, b"PASS")
    os._exit(0)


try:
    main()
except BaseException as e:
    sys.stderr.write("check failed: %s: %s\n" % (type(e).__name__, str(e)[:500]))
    os._exit(2)
