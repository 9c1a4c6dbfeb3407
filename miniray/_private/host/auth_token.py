"""The cluster token that peers prove to each other: where it comes from, and making one.

Owns: finding the token (``load_token``), saying where it came from without showing it
(``token_source``), creating it once, safely (``load_token(create=True)``), the error
for every problem with it (``AuthTokenError``), and the TLS settings beside it
(``tls_files``: whether TLS is on and the certificate files, Ray's variable names). Does
not own: how the token is proven on a connection (``transport/peer_wire.py``: a
challenge-response, the token itself never travels), or when a token is required (the
node: peering off loopback refuses to start without one).
Called by: the node and ``miniray start`` when they listen or join, ``miniray
get-auth-token`` (cli.py), and drivers connecting to a remote node.

Sources, first found wins (Ray's order, Ray's variable names accepted)::

    1. env MINIRAY_AUTH_TOKEN, then RAY_AUTH_TOKEN          the token itself
    2. env MINIRAY_AUTH_TOKEN_PATH, then RAY_AUTH_TOKEN_PATH a file holding it
    3. ~/.miniray/auth_token                                the default file (never ~/.ray)

Leading and trailing whitespace is ignored; a token shorter than ``MIN_TOKEN_BYTES`` is
refused. A file is read only if it is a regular file of this uid that neither group nor
others may read (the error names the file and the ``chmod`` to run).

Creating (``create=True``, no token anywhere): ``secrets.token_hex(32)`` goes into the file
source (the ``*_PATH`` file if one is named, else the default), in a 0700 directory:

    1. write the token to a temporary file beside it, opened with O_CREAT|O_EXCL, mode 0600;
    2. ``link`` it to the final name: this fails if the name exists, so of two concurrent
       creators exactly one wins, and the other reads the winner's token;
    3. unlink the temporary name.

Readers never see a half-written file (the final name appears complete), and nobody
overwrites a token another process already handed out.
"""

from __future__ import annotations

import os
import secrets
import stat

__all__ = [
    "AuthTokenError", "DEFAULT_RELATIVE_PATH", "MIN_TOKEN_BYTES", "TOKEN_ENV", "TOKEN_PATH_ENV",
    "TLS_ENV", "default_token_path", "file_problem", "load_token", "read_token_file", "resolve",
    "tls_files", "token_source",
]  # fmt: skip

TOKEN_ENV = ("MINIRAY_AUTH_TOKEN", "RAY_AUTH_TOKEN")
TOKEN_PATH_ENV = ("MINIRAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN_PATH")
DEFAULT_RELATIVE_PATH = os.path.join(".miniray", "auth_token")
MIN_TOKEN_BYTES = 16
# TLS between hosts: the switch, then the files (each: miniray's name, then Ray's).
TLS_ENV = {
    "use": ("MINIRAY_USE_TLS", "RAY_USE_TLS"),
    "cert": ("MINIRAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_CERT"),
    "key": ("MINIRAY_TLS_SERVER_KEY", "RAY_TLS_SERVER_KEY"),
    "ca": ("MINIRAY_TLS_CA_CERT", "RAY_TLS_CA_CERT"),
}
_READ_LIMIT = 64 * 1024  # a token file larger than this is not a token file


class AuthTokenError(ValueError):
    """The cluster token is missing, too short, or kept in a file others could read (or
    TLS between hosts is on but its files are missing or unreadable).

    The message names the source (variable or file) and what to do; it never contains the
    token.
    """


def default_token_path(home: str | None = None) -> str:
    """``~/.miniray/auth_token`` under ``home`` (default: this user's home)."""
    return os.path.join(home if home is not None else os.path.expanduser("~"),
                        DEFAULT_RELATIVE_PATH)


def resolve(environ=None, home: str | None = None) -> tuple[str, str, str]:
    """Pure (given ``environ`` and ``home``): which source applies, as ``(kind, name,
    description)``: kind ``"env"`` (name is the variable) or ``"file"`` (name is the path).

    The file source is the one a token would be created in: the ``*_PATH`` file if one is
    named, else the default file, whether or not it exists yet.

    Example:
        >>> resolve({"RAY_AUTH_TOKEN": "x" * 20}, "/home/u")
        ('env', 'RAY_AUTH_TOKEN', 'environment variable RAY_AUTH_TOKEN')
        >>> resolve({}, "/home/u")[1]
        '/home/u/.miniray/auth_token'
    """
    environ = os.environ if environ is None else environ
    for name in TOKEN_ENV:
        if name in environ:
            return "env", name, f"environment variable {name}"
    for name in TOKEN_PATH_ENV:
        value = environ.get(name)
        if value:
            path = os.path.abspath(os.path.expanduser(value))
            return "file", path, f"file {path} (named by {name})"
    path = default_token_path(home)
    return "file", path, f"file {path} (the default)"


def token_source(environ=None, home: str | None = None) -> str:
    """Where the token comes from, for messages: a variable's name or a file's path (never
    the token). Example: ``"file /home/u/.miniray/auth_token (the default)"``."""
    return resolve(environ, home)[2]


def _check(token: bytes, description: str) -> bytes:
    if not token:
        raise AuthTokenError(
            f"The miniray cluster token in {description} is empty. Put the token there "
            "(`miniray get-auth-token` on the head node prints it), or unset it to use the "
            "next source.")
    if len(token) < MIN_TOKEN_BYTES:
        raise AuthTokenError(
            f"The miniray cluster token in {description} is {len(token)} bytes long; at "
            f"least {MIN_TOKEN_BYTES} are needed. Use the head's token (`miniray "
            "get-auth-token` there prints it) or make one with `miniray get-auth-token "
            "--generate`.")
    return token


def file_problem(st: os.stat_result, uid: int) -> str | None:
    """Pure: why a token file with ``fstat`` ``st`` must not be trusted by ``uid``, or None."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != uid:
        return f"belongs to uid {st.st_uid}, not to this user (uid {uid})"
    if stat.S_IMODE(st.st_mode) & 0o077:
        return (f"has mode {stat.S_IMODE(st.st_mode):04o}: other users may read the token "
                "(or change it)")
    return None


def read_token_file(path: str, description: str | None = None) -> bytes | None:
    """The token in the file ``path``, or None if there is no such file; AuthTokenError if
    it is not this user's private regular file, or its token is too short."""
    description = description or f"file {path}"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as error:
        raise AuthTokenError(f"Cannot read the miniray cluster token from {description}: "
                             f"{error.strerror}.") from None
    try:
        problem = file_problem(os.fstat(fd), os.getuid())
        if problem:
            raise AuthTokenError(
                f"miniray refuses the cluster token in {description}: it {problem}. Run "
                f"`chmod 600 {path}` (as its owner), or point MINIRAY_AUTH_TOKEN_PATH at a "
                "file of your own.")
        data = b""
        while len(data) <= _READ_LIMIT:
            chunk = os.read(fd, _READ_LIMIT + 1 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) > _READ_LIMIT:
        raise AuthTokenError(f"{description} is larger than {_READ_LIMIT} bytes: it is not "
                             "a miniray token file.")
    return _check(data.strip(), description)


def _create(path: str, description: str) -> bytes:
    """Steps 1-3 of the module docstring; returns the token now in ``path`` (ours or the
    one a concurrent creator linked first)."""
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as error:
        raise AuthTokenError(f"Cannot create the directory {directory} for the miniray "
                             f"cluster token: {error.strerror}.") from None
    token = secrets.token_hex(32).encode()
    temp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
                 | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        try:
            os.write(fd, token + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temp, path)
        except FileExistsError:
            pass  # a concurrent creator won: use its token (read below)
    finally:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
    found = read_token_file(path, description)
    if found is None:  # removed between link and read: nothing sensible left to do
        raise AuthTokenError(f"The miniray cluster token file {path} vanished while it was "
                             "being created; try again.")
    return found


def load_token(*, create: bool = False, environ=None, home: str | None = None) -> bytes:
    """The cluster token, from the first source that has one (module docstring).

    Args:
        create: When no source has a token, generate one into the file source (mode 0600,
            in a 0700 directory) instead of raising.
        environ: The environment to read (default ``os.environ``); for tests.
        home: The home directory of the default file (default ``~``); for tests.

    Raises:
        AuthTokenError: no token (and ``create`` is False), an empty or short token, or a
            token file others may read; the message names the source and what to do.

    Example:
        >>> load_token(environ={"MINIRAY_AUTH_TOKEN": "0123456789abcdef"})
        b'0123456789abcdef'
    """
    environ = os.environ if environ is None else environ
    kind, name, description = resolve(environ, home)
    if kind == "env":
        return _check(environ[name].strip().encode(), description)
    token = read_token_file(name, description)
    if token is not None:
        return token
    if create:
        return _create(name, description)
    raise AuthTokenError(
        f"No miniray cluster token: none of {', '.join(TOKEN_ENV)} is set and {description} "
        "does not exist. On the head node, `miniray get-auth-token --generate` makes one and "
        "prints it; give the same token to every node and driver (MINIRAY_AUTH_TOKEN, or a "
        "0600 file named by MINIRAY_AUTH_TOKEN_PATH).")


def _first(environ, names) -> tuple[str | None, str]:
    for name in names:
        value = environ.get(name)
        if value:
            return value, name
    return None, names[0]


def tls_files(environ=None) -> tuple[str, str, str] | None:
    """``(cert, key, ca)`` when TLS between hosts is on (``MINIRAY_USE_TLS`` or Ray's
    ``RAY_USE_TLS`` is 1/true), else None. Every host presents ``cert``/``key`` (a server
    and a client certificate at once, as in Ray) and accepts only peers whose certificate
    ``ca`` signed. AuthTokenError names a missing or unreadable file's variable.

    Example:
        >>> tls_files({}) is None
        True
    """
    environ = os.environ if environ is None else environ
    use, _ = _first(environ, TLS_ENV["use"])
    if not use or use.strip().lower() in ("0", "false", "no", "off"):
        return None
    files = []
    for what in ("cert", "key", "ca"):
        path, name = _first(environ, TLS_ENV[what])
        if not path:
            needed = ", ".join(TLS_ENV[key][0] for key in ("cert", "key", "ca"))
            raise AuthTokenError(
                f"TLS between hosts is on ({'/'.join(TLS_ENV['use'])}) but {name} (or "
                f"{TLS_ENV[what][1]}) is not set: set {needed} on every host.")
        path = os.path.abspath(os.path.expanduser(path))
        if not os.access(path, os.R_OK):
            raise AuthTokenError(f"The TLS file {path} (from {name}) cannot be read.")
        files.append(path)
    return files[0], files[1], files[2]
