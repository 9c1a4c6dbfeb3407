"""host/auth_token.py: the token's sources in order, the file checks, safe creation.

Every test injects ``environ`` and ``home`` (a tmp_path): the real ``~/.miniray`` and the
real environment are never read or written.
"""

from __future__ import annotations

import os
import pickle
import stat
import threading

import pytest

from miniray._private.host import auth_token
from miniray._private.host.auth_token import AuthTokenError, load_token, token_source

TOKEN = "0123456789abcdef0123456789abcdef"


def _write(path, text, mode=0o600):
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_sources_in_ray_order(tmp_path):
    home = str(tmp_path)
    miniray_file = _write(tmp_path / "m.token", "m" * 20 + "\n")
    ray_file = _write(tmp_path / "r.token", "r" * 20)
    _write(tmp_path / ".miniray" / "auth_token", "d" * 20)
    env = {"MINIRAY_AUTH_TOKEN": "a" * 20, "RAY_AUTH_TOKEN": "b" * 20,
           "MINIRAY_AUTH_TOKEN_PATH": str(miniray_file), "RAY_AUTH_TOKEN_PATH": str(ray_file)}
    expected = [
        ("MINIRAY_AUTH_TOKEN", b"a" * 20, "environment variable MINIRAY_AUTH_TOKEN"),
        ("RAY_AUTH_TOKEN", b"b" * 20, "environment variable RAY_AUTH_TOKEN"),
        ("MINIRAY_AUTH_TOKEN_PATH", b"m" * 20, f"file {miniray_file} (named by "
                                               "MINIRAY_AUTH_TOKEN_PATH)"),
        ("RAY_AUTH_TOKEN_PATH", b"r" * 20, f"file {ray_file} (named by RAY_AUTH_TOKEN_PATH)"),
    ]
    for name, token, source in expected:
        assert load_token(environ=env, home=home) == token
        assert token_source(env, home) == source
        assert token.decode() not in token_source(env, home)
        del env[name]
    assert load_token(environ=env, home=home) == b"d" * 20
    assert token_source(env, home) == (f"file {tmp_path / '.miniray' / 'auth_token'} "
                                       "(the default)")


def test_never_reads_ray_home_file(tmp_path):
    _write(tmp_path / ".ray" / "auth_token", "x" * 32)
    with pytest.raises(AuthTokenError, match="No miniray cluster token") as info:
        load_token(environ={}, home=str(tmp_path))
    assert "get-auth-token --generate" in str(info.value)
    assert ".miniray/auth_token" in str(info.value)


def test_whitespace_stripped_and_short_or_empty_refused(tmp_path):
    assert load_token(environ={"RAY_AUTH_TOKEN": f"  {TOKEN}\n"}, home=str(tmp_path)) \
        == TOKEN.encode()
    for value, match in (("", "is empty"), ("   ", "is empty"), ("short", "5 bytes long")):
        with pytest.raises(AuthTokenError, match=match) as info:
            load_token(environ={"MINIRAY_AUTH_TOKEN": value}, home=str(tmp_path))
        assert "environment variable MINIRAY_AUTH_TOKEN" in str(info.value)
    path = _write(tmp_path / "t", "abc\n")
    with pytest.raises(AuthTokenError, match="3 bytes long"):
        load_token(environ={"MINIRAY_AUTH_TOKEN_PATH": str(path)}, home=str(tmp_path))


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_file_readable_by_others_is_refused_with_the_chmod(tmp_path, mode):
    path = _write(tmp_path / ".miniray" / "auth_token", TOKEN, mode)
    with pytest.raises(AuthTokenError) as info:
        load_token(environ={}, home=str(tmp_path))
    text = str(info.value)
    assert str(path) in text and f"chmod 600 {path}" in text
    assert f"{mode:04o}" in text and TOKEN not in text


def test_file_of_another_uid_is_refused():
    st = os.stat_result((stat.S_IFREG | 0o600, 0, 0, 1, os.getuid() + 1, 0, 0, 0, 0, 0))
    assert "belongs to uid" in auth_token.file_problem(st, os.getuid())
    st = os.stat_result((stat.S_IFDIR | 0o700, 0, 0, 1, os.getuid(), 0, 0, 0, 0, 0))
    assert auth_token.file_problem(st, os.getuid()) == "is not a regular file"
    st = os.stat_result((stat.S_IFREG | 0o600, 0, 0, 1, os.getuid(), 0, 0, 0, 0, 0))
    assert auth_token.file_problem(st, os.getuid()) is None


def test_a_directory_or_huge_file_is_not_a_token(tmp_path):
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.raises(AuthTokenError, match="not a regular file"):
        load_token(environ={"MINIRAY_AUTH_TOKEN_PATH": str(tmp_path / "dir")},
                   home=str(tmp_path))
    big = _write(tmp_path / "big", "x" * (auth_token._READ_LIMIT + 10))
    with pytest.raises(AuthTokenError, match="not a miniray token file"):
        load_token(environ={"MINIRAY_AUTH_TOKEN_PATH": str(big)}, home=str(tmp_path))


def test_create_makes_a_private_file_once(tmp_path):
    token = load_token(create=True, environ={}, home=str(tmp_path))
    path = tmp_path / ".miniray" / "auth_token"
    assert len(token) == 64 and int(token, 16) >= 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_bytes() == token + b"\n"
    assert load_token(create=True, environ={}, home=str(tmp_path)) == token
    assert load_token(environ={}, home=str(tmp_path)) == token
    assert sorted(os.listdir(path.parent)) == ["auth_token"]  # no temporary file left


def test_create_goes_to_the_named_path_and_never_overrides_env(tmp_path):
    target = tmp_path / "sub" / "dir" / "token"
    env = {"RAY_AUTH_TOKEN_PATH": str(target)}
    token = load_token(create=True, environ=env, home=str(tmp_path))
    assert target.read_bytes().strip() == token
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    assert not (tmp_path / ".miniray").exists()
    env = {"MINIRAY_AUTH_TOKEN": TOKEN}
    assert load_token(create=True, environ=env, home=str(tmp_path)) == TOKEN.encode()
    assert not (tmp_path / ".miniray").exists()


def test_concurrent_creators_agree(tmp_path):
    results, errors = [], []
    barrier = threading.Barrier(8)

    def create():
        barrier.wait()
        try:
            results.append(load_token(create=True, environ={}, home=str(tmp_path)))
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not errors and len(results) == 8 and len(set(results)) == 1
    assert sorted(os.listdir(tmp_path / ".miniray")) == ["auth_token"]


def test_create_where_a_creator_won_between_check_and_link(tmp_path, monkeypatch):
    """The link step fails when the name appeared: the other creator's token is used."""
    path = tmp_path / ".miniray" / "auth_token"
    real_link = os.link

    def link_after_rival(src, dst):
        _write(path, "w" * 64)
        return real_link(src, dst)

    monkeypatch.setattr(os, "link", link_after_rival)
    assert load_token(create=True, environ={}, home=str(tmp_path)) == b"w" * 64
    assert sorted(os.listdir(path.parent)) == ["auth_token"]


def test_error_pickles_and_is_a_value_error():
    error = AuthTokenError("text")
    assert isinstance(error, ValueError)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is AuthTokenError and str(again) == "text"


@pytest.fixture
def fake_home(tmp_path, monkeypatch):
    """HOME at tmp_path and no token variable: the CLI reads only the test's files."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in auth_token.TOKEN_ENV + auth_token.TOKEN_PATH_ENV:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_cli_get_auth_token(fake_home, capsys, monkeypatch):
    from miniray._private import cli

    assert cli.main(["get-auth-token"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "No miniray cluster token" in err and "--generate" in err
    assert cli.main(["get-auth-token", "--generate"]) == 0
    out, err = capsys.readouterr()
    path = fake_home / ".miniray" / "auth_token"
    assert out == path.read_text() and len(out.strip()) == 64
    assert f"made a new cluster token in file {path}" in err
    assert cli.main(["get-auth-token", "--generate"]) == 0
    again, err = capsys.readouterr()
    assert again == out and err == ""
    assert cli.main(["get-auth-token"]) == 0 and capsys.readouterr()[0] == out
    os.chmod(path, 0o644)
    assert cli.main(["get-auth-token"]) == 1
    assert f"chmod 600 {path}" in capsys.readouterr()[1]
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    assert cli.main(["get-auth-token"]) == 0 and capsys.readouterr()[0] == TOKEN + "\n"
