"""The offline guard: a `sitecustomize.py` that takes the network and torch_xla away from every process it
starts in (see tests/end_to_end/test_offline_infer.py, which explains it). Shared by that test and by the version matrix
(matrix/run.py, leg kaggle-gpu), so both run the submission path under the same guard."""

GUARD = r'''
import errno
import os
import socket
import sys

_LOG = os.environ.get("OFFLINE_GUARD_LOG")


def _note(text):
    if _LOG:
        with open(_LOG, "a") as handle:
            handle.write(f"{os.getpid()} {text}\n")


_note("loaded " + " ".join(getattr(sys, "orig_argv", sys.argv)[:4]))

_LOCAL_HOSTS = {"127.0.0.1", "::1", "localhost", "0.0.0.0", "::", None, ""}


def _local(address):
    if isinstance(address, (str, bytes)):  # an AF_UNIX path
        return True
    host = address[0] if isinstance(address, tuple) and address else address
    if isinstance(host, bytes):
        host = host.decode()
    return host in _LOCAL_HOSTS or (isinstance(host, str) and host.startswith("127."))


def _refuse(what, target):
    _note(f"blocked {what} {target!r}")
    raise OSError(errno.ENETUNREACH, f"network access blocked by the offline guard: {what} {target!r}")


_connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex
_getaddrinfo, _create_connection = socket.getaddrinfo, socket.create_connection
_gethostbyname = socket.gethostbyname


def connect(self, address):
    if self.family == getattr(socket, "AF_UNIX", None) or _local(address):
        return _connect(self, address)
    _refuse("connect", address)


def connect_ex(self, address):
    if self.family == getattr(socket, "AF_UNIX", None) or _local(address):
        return _connect_ex(self, address)
    _refuse("connect_ex", address)


def getaddrinfo(host, *args, **kwargs):
    if _local((host,)):
        return _getaddrinfo(host, *args, **kwargs)
    _refuse("getaddrinfo", host)


def create_connection(address, *args, **kwargs):
    if _local(address):
        return _create_connection(address, *args, **kwargs)
    _refuse("create_connection", address)


def gethostbyname(host):
    if _local((host,)):
        return _gethostbyname(host)
    _refuse("gethostbyname", host)


socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
socket.getaddrinfo, socket.create_connection, socket.gethostbyname = getaddrinfo, create_connection, gethostbyname


class _NoTorchXla:
    """Backstop if something removes the sys.modules entry: the import still fails."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch_xla" or name.startswith("torch_xla."):
            _note(f"blocked import {name}")
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the offline guard)", name=name)
        return None


sys.meta_path.insert(0, _NoTorchXla())
sys.modules["torch_xla"] = None  # absent, as on Kaggle's GPU image: import fails, find_spec returns None
'''
