"""``shm_domain_id`` (host/shm_domain.py): processes sharing one shm directory, and no others,
get one id; and ``MINIRAY_SHM_DIR``'s checks (object_store/shm_segments.py)."""

from __future__ import annotations

import os
import stat

import pytest

from miniray._private.core import config
from miniray._private.host import same_uid, shm_domain, shm_mounts
from miniray._private.object_store import shm_segments


def test_domain_id_is_stable_and_each_field_counts():
    base = shm_domain.domain_id("boot-a", 23, 1, "")
    assert base == shm_domain.domain_id("boot-a\n", 23, 1, "")
    assert base.startswith("shm-") and len(base) == 24
    others = {shm_domain.domain_id("boot-b", 23, 1, ""), shm_domain.domain_id("boot-a", 24, 1, ""),
              shm_domain.domain_id("boot-a", 23, 2, ""), shm_domain.domain_id("boot-a", 23, 1, "h")}
    assert base not in others and len(others) == 4


def test_two_fake_hosts_with_their_own_shm_dirs_differ(tmp_path, monkeypatch):
    a, b = tmp_path / "hostA", tmp_path / "hostB"
    a.mkdir()
    b.mkdir()
    monkeypatch.delenv("MINIRAY_HOST_ID", raising=False)
    monkeypatch.setenv("MINIRAY_SHM_DIR", str(a))
    id_a = shm_domain.shm_domain_id()
    assert id_a == shm_domain.shm_domain_id(str(a))  # the setting is the default
    assert id_a == shm_domain.shm_domain_id(str(a) + "/")  # spelling does not matter
    assert shm_domain.shm_domain_id(str(b)) != id_a
    monkeypatch.setenv("MINIRAY_HOST_ID", "hostA")
    assert shm_domain.shm_domain_id() != id_a  # the host id is part of the domain
    assert shm_domain.shm_domain_id(host_id="") == id_a


def test_the_same_dir_through_a_symlink_is_the_same_domain(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert shm_domain.shm_domain_id(str(tmp_path / "link"), "") == \
        shm_domain.shm_domain_id(str(real), "")


def test_a_missing_dir_has_no_domain(tmp_path):
    with pytest.raises(OSError):
        shm_domain.shm_domain_id(str(tmp_path / "missing"), "")


def test_shm_dir_setting(monkeypatch, tmp_path):
    monkeypatch.delenv("MINIRAY_SHM_DIR", raising=False)
    assert config.shm_dir() == "/dev/shm"
    monkeypatch.setenv("MINIRAY_SHM_DIR", str(tmp_path / "x" / ".." / "y"))
    assert config.shm_dir() == str(tmp_path / "y")


def _st(mode: int, uid: int = 1000):
    return os.stat_result((mode, 0, 0, 0, uid, 0, 0, 0, 0, 0))


@pytest.mark.parametrize("mode,uid,refused", [
    (stat.S_IFDIR | 0o700, 1000, None),
    (stat.S_IFDIR | 0o755, 1000, None),
    (stat.S_IFDIR | 0o1777, 0, None),           # /dev/shm itself, /tmp
    (stat.S_IFDIR | 0o1777, 1000, None),        # ours, sticky
    (stat.S_IFDIR | 0o777, 1000, "without the sticky bit"),
    (stat.S_IFDIR | 0o770, 1000, "without the sticky bit"),
    (stat.S_IFDIR | 0o700, 1001, "belongs to"),
    (stat.S_IFDIR | 0o1777, 1001, "belongs to"),  # someone else's sticky dir
    (stat.S_IFLNK | 0o777, 1000, "symbolic link"),
    (stat.S_IFREG | 0o600, 1000, "not a directory"),
])
def test_shm_dir_refusal(mode, uid, refused):
    problem = shm_segments.shm_dir_refusal(_st(mode, uid), 1000)
    if refused is None:
        assert problem is None
    else:
        assert refused in problem


def test_prepare_creates_a_private_dir(tmp_path):
    path = tmp_path / "a" / "shm"
    assert shm_segments.prepare_shm_dir(str(path)) == str(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert os.listdir(path) == []  # the mmap probe is gone
    assert shm_segments.prepare_shm_dir(str(path)) == str(path)  # existing: fine


def test_prepare_refuses_a_world_writable_dir(tmp_path):
    path = tmp_path / "open"
    path.mkdir()
    path.chmod(0o777)
    with pytest.raises(same_uid.InsecurePathError, match="MINIRAY_SHM_DIR=.*sticky bit"):
        shm_segments.prepare_shm_dir(str(path))


def test_prepare_refuses_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(same_uid.InsecurePathError, match="not a directory"):
        shm_segments.prepare_shm_dir(str(path))


def test_prepare_leaves_dev_shm_alone():
    assert shm_segments.prepare_shm_dir("/dev/shm/") == "/dev/shm"


def test_prepare_refuses_a_relative_path():
    with pytest.raises(ValueError, match="absolute path"):
        shm_segments.prepare_shm_dir("shm")


def test_memory_backed_reads_the_longest_mount(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
        "25 22 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw\n"
        "26 22 0:24 / /mnt/my\\040disk rw - xfs /dev/sdb rw\n")
    assert shm_mounts.memory_backed("/dev/shm/x", str(info)) is True
    assert shm_mounts.memory_backed("/home/u", str(info)) is False
    assert shm_mounts.memory_backed("/mnt/my disk/a", str(info)) is False
    assert shm_mounts.memory_backed("/x", str(tmp_path / "none")) is None


def test_huge_pages_reads_the_tmpfs_mode_and_the_kernels_override(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
        "25 22 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=100k\n"
        "27 22 0:25 / /mnt/huge rw - tmpfs tmpfs rw,size=1g,huge=within_size\n"
        "28 22 0:26 / /mnt/all rw - tmpfs tmpfs rw,huge=always\n"
        "29 27 0:27 / /mnt/huge/plain rw - tmpfs tmpfs rw\n")  # mounted inside it
    enabled = tmp_path / "shmem_enabled"
    enabled.write_text("always within_size advise [never] deny force\n")

    def mode(path):
        return shm_mounts.huge_pages(path, str(info), str(enabled))

    assert mode("/dev/shm/x") == "never"
    assert mode("/mnt/huge") == mode("/mnt/huge/a") == "within_size"
    assert mode("/mnt/huge/plain/a") == "never"  # the longest mount point wins
    assert mode("/mnt/all/a") == "always"
    assert mode("/home/u") is None  # not a tmpfs
    assert shm_mounts.huge_pages("/mnt/huge", str(tmp_path / "none"), str(enabled)) is None
    # The kernel's deny and force override every mount; an unreadable file, nothing.
    enabled.write_text("always within_size advise never [deny] force\n")
    assert mode("/mnt/huge/a") == "never"
    enabled.write_text("always within_size advise never deny [force]\n")
    assert mode("/dev/shm/x") == "always"
    assert shm_mounts.huge_pages("/mnt/huge", str(info), str(tmp_path / "none")) == \
        "within_size"


def test_prepare_warns_of_a_tmpfs_that_gives_small_objects_huge_pages(
        tmp_path, monkeypatch, caplog):
    modes = {"always": True, "within_size": False, "never": False, None: False}
    for mode, warned in modes.items():
        monkeypatch.setattr(shm_mounts, "describe", lambda path, mode=mode: (True, mode))
        caplog.clear()
        for path in (str(tmp_path / "shm"), "/dev/shm"):
            assert shm_segments.prepare_shm_dir(path) == path
            said = [r.getMessage() for r in caplog.records if "huge=always" in r.getMessage()]
            assert bool(said) == warned, (mode, path, said)
            if warned:
                assert "huge=within_size" in said[0] and path in said[0]
            caplog.clear()
