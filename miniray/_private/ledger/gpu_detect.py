"""GPU detection at node start: how many NVIDIA GPUs the node sees, their ids, names and UUIDs.

Owns: asking NVML (``pynvml``, the ``[gpu]`` extra) what devices the host has, applying the
``CUDA_VISIBLE_DEVICES`` the node was started with (it restricts *and names* the devices), the
key under which each device is shared through the host-wide GPU ledger (``host_gpus.py``), and
Ray 2.60's rule that turns a device name into an ``accelerator_type``.

Does not own: the node's ``num_gpus`` (``init()`` decides: an explicit ``num_gpus`` overrides the
detected count, since resources are logical), assigning GPUs to tasks (``ledger.py`` /
``resources.py``), or sharing devices between sessions (``host_gpus.py``).
Called by: the runtime at ``init()`` and ``miniray start``.

::

    pynvml (or a test double passed as nvml=) ──► _query_devices ──► [_Device(index, name,
                                                                       uuid, MIG uuids)]
    CUDA_VISIBLE_DEVICES ──► parse_visible_devices ──┐                 │
                                                     ▼                 ▼
                                     inventory_from_devices (pure) ──► GpuInventory

NVML is optional: without ``pynvml``, without a driver, or when any NVML call before the device
count fails, the node has 0 GPUs and no error is raised (Ray 2.60 behaves the same). NVML is
always shut down again after a successful ``nvmlInit``.

Mirrors ``ray._private.accelerators.nvidia_gpu`` (Ray 2.60): the count is NVML's device count,
capped at the number of ``CUDA_VISIBLE_DEVICES`` entries when that variable is set; the ids are
the variable's entries (strings) when it is set, else ``0..n-1`` (ints); the accelerator type
follows :func:`accelerator_type_from_name`. Differs:

* The accelerator type comes from the first device the node *sees* (after
  ``CUDA_VISIBLE_DEVICES``); Ray reads NVML device 0 even when the variable hides it. The two
  agree except on hosts that mix GPU models.
* Each visible id is resolved to a physical device (by index, GPU UUID or MIG UUID, a unique
  UUID prefix included, as CUDA accepts), so the host-wide ledger can tell two sessions that
  name one device differently (``CUDA_VISIBLE_DEVICES=1`` vs ``=0,1``) that they share it. An
  entry that names no device NVML reports is still counted, as Ray counts it, but it is a
  logical GPU only: it has no ``device_key`` and is not shared through the host ledger.
* Numeric entries are NVML (PCI bus) indices. CUDA orders devices fastest-first unless
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; the two orders agree on hosts with one GPU model, which is
  also what Ray assumes.
"""

from __future__ import annotations

import logging
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, Union

from miniray._private.core import config

__all__ = [
    "GpuInventory",
    "NvmlBackend",
    "accelerator_type_from_name",
    "detect_gpus",
    "inventory_from_devices",
    "parse_visible_devices",
]

logger = logging.getLogger(__name__)


class NvmlBackend(Protocol):
    """The NVML calls detection makes; the ``pynvml`` module satisfies it as it is.

    Names and UUIDs may be ``str`` or ``bytes`` (older pynvml returns bytes). Any call may
    raise; what happens then is described in :func:`detect_gpus`. Two more functions are used
    when present, and only when a ``CUDA_VISIBLE_DEVICES`` entry is a MIG id:
    ``nvmlDeviceGetMaxMigDeviceCount(handle) -> int`` and
    ``nvmlDeviceGetMigDeviceHandleByIndex(handle, index) -> handle``.
    """

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int: ...

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...

    def nvmlDeviceGetName(self, handle: Any) -> Union[str, bytes]: ...

    def nvmlDeviceGetUUID(self, handle: Any) -> Union[str, bytes]: ...


@dataclass(frozen=True)
class GpuInventory:
    """What the node sees. Every list is aligned with ``ids`` (one entry per GPU).

    Attributes:
        count: GPUs the node has when ``num_gpus`` is not given (the ledger's ``GPU`` total).
        ids: the instance ids the node assigns: ``CUDA_VISIBLE_DEVICES`` entries when it was
            set, else ``"0".."count-1"``. Workers get them in ``CUDA_VISIBLE_DEVICES``.
        ids_are_ints: whether ``get_gpu_ids()`` returns ints (Ray 2.60: ints when
            ``CUDA_VISIBLE_DEVICES`` was not set, strings, possibly UUIDs, when it was).
        names: NVML device names (``"NVIDIA H100 80GB HBM3"``); None where unknown.
        uuids: device UUIDs (``"GPU-..."``, or ``"MIG-..."`` for a MIG instance); None where
            unknown.
        device_keys: the key of each GPU in the host-wide GPU ledger, naming the physical
            device (or MIG instance): its UUID when NVML gives one, else ``"nvml-index:<i>"``;
            None for an id that names no device NVML reports (a logical GPU only).
        accelerator_type: from the first visible device's name (see
            :func:`accelerator_type_from_name`); None without GPUs.
        physical_count: devices NVML reports on the host, before ``CUDA_VISIBLE_DEVICES``.
    """

    count: int = 0
    ids: list[str] = field(default_factory=list)
    ids_are_ints: bool = True
    names: list[str | None] = field(default_factory=list)
    uuids: list[str | None] = field(default_factory=list)
    device_keys: list[str | None] = field(default_factory=list)
    accelerator_type: str | None = None
    physical_count: int = 0

    def key_of(self, gpu_id: str) -> str | None:
        """The host-ledger key of instance id ``gpu_id``; None for a logical-only GPU."""
        try:
            return self.device_keys[self.ids.index(str(gpu_id))]
        except ValueError:
            return None


@dataclass(frozen=True)
class _Device:
    """One physical device as NVML reported it (``index`` in NVML's order)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    mig_uuids: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------
# Device name -> accelerator type (Ray 2.60)

# After the first word (vendor or brand, e.g. "NVIDIA", "Tesla", "Quadro"): any all-caps
# words ("RTX", "PRO"), then the first word made of capitals and digits that contains a
# digit. The model word ends at the first other character, which drops SKU suffixes such as
# "-SXM4-40GB". The match is anchored at the start of the name.
_MODEL_AFTER_BRAND = re.compile(
    r"""
    \w+ \s+                        # the vendor or brand word
    (?P<model>
        (?: [A-Z]+ \s+ )*          # all-caps words before the model number ("RTX PRO ")
        [A-Z0-9]* [0-9] [A-Z0-9]*  # the model word: capitals and digits, with a digit
    )
    """,
    re.VERBOSE,
)
_LEADING_NVIDIA = re.compile(r"^NVIDIA\s+")


def accelerator_type_from_name(name: str | None) -> str | None:
    """The ``accelerator_type`` Ray 2.60 derives from an NVML device name.

    Skip the first word; take the run of all-caps words up to and including the first word of
    capitals and digits that contains a digit, stopping that word at its first other character
    (so "-SXM4-40GB" style suffixes drop); join the words with "-". If that finds nothing, or
    only a single character, strip a leading "NVIDIA " and replace spaces with "-" (mixed-case
    consumer names). None for None or a name that leaves nothing.

    Example:
        >>> accelerator_type_from_name("NVIDIA A100-SXM4-40GB")
        'A100'
        >>> accelerator_type_from_name("NVIDIA RTX PRO 6000 Blackwell Server Edition")
        'RTX-PRO-6000'
        >>> accelerator_type_from_name("NVIDIA GeForce RTX 4090")
        'GeForce-RTX-4090'
    """
    if name is None:
        return None
    match = _MODEL_AFTER_BRAND.match(name)
    if match is not None:
        model = match.group("model").replace(" ", "-")  # each space, as Ray replaces them
        if len(model) > 1:
            return model
    rest = _LEADING_NVIDIA.sub("", name).strip()
    return rest.replace(" ", "-") if rest else None


# ---------------------------------------------------------------------------------------------
# CUDA_VISIBLE_DEVICES


def parse_visible_devices(value: str | None) -> list[str] | None:
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value; None when it is not set.

    ``""`` and ``"NoDevFiles"`` mean no devices (``[]``), as in Ray. Entries are stripped and
    empty entries dropped, as the runtime does.
    """
    if value is None:
        return None
    value = value.strip()
    if value in ("", "NoDevFiles"):
        return []
    return [part.strip() for part in value.split(",") if part.strip()]


def _by_uuid(candidates: Sequence[tuple[str, Any]], entry: str) -> Any:
    """The item whose UUID equals ``entry``, or that ``entry`` is the unique prefix of."""
    want = entry.lower()
    exact = [item for uuid, item in candidates if uuid.lower() == want]
    if exact:
        return exact[0]
    prefixed = [item for uuid, item in candidates if uuid.lower().startswith(want)]
    return prefixed[0] if len(prefixed) == 1 else None


def _resolve(entry: str, devices: Sequence[_Device]) -> tuple[_Device | None, str | None]:
    """The device a visible-devices entry names, and the UUID of what it names (a MIG
    instance's own UUID for a MIG entry); (None, None) when it names nothing NVML reports."""
    if entry.isascii() and entry.isdigit():
        index = int(entry)
        if index < len(devices):
            return devices[index], devices[index].uuid
        return None, None
    if entry.startswith("MIG-GPU-"):
        # Pre-R470 MIG id: MIG-<parent GPU UUID>/<GPU instance>/<compute instance>.
        parent_uuid = entry[len("MIG-") :].split("/", 1)[0]
        parent = _by_uuid([(d.uuid, d) for d in devices if d.uuid], parent_uuid)
        return (parent, entry) if parent is not None else (None, None)
    if entry.startswith("MIG-"):
        pairs = [(mig, (d, mig)) for d in devices for mig in d.mig_uuids]
        found = _by_uuid(pairs, entry)
        return found if found is not None else (None, None)
    if entry.startswith("GPU-"):
        device = _by_uuid([(d.uuid, d) for d in devices if d.uuid], entry)
        return (device, device.uuid) if device is not None else (None, None)
    return None, None


def _device_key(device: _Device | None, uuid: str | None) -> str | None:
    if device is None:
        return None
    return uuid if uuid else f"nvml-index:{device.index}"


def inventory_from_devices(devices: Sequence[_Device], visible: list[str] | None) -> GpuInventory:
    """The node's GPUs given NVML's devices and the parsed ``CUDA_VISIBLE_DEVICES`` (pure).

    Without ``visible`` every device is seen, with ids ``"0".."n-1"``. With it, the count is
    ``min(len(devices), len(visible))`` (Ray's rule: ``"3,5"`` on a host without GPUs gives 0)
    and the ids are the first ``count`` entries, each resolved to the device it names.
    """
    if visible is None:
        chosen = [(str(d.index), d, d.uuid) for d in devices]
        ids_are_ints = True
    else:
        count = min(len(devices), len(visible))
        chosen = [(entry, *_resolve(entry, devices)) for entry in visible[:count]]
        ids_are_ints = False
        unresolved = [entry for entry, device, _ in chosen if device is None]
        if unresolved:
            logger.warning(
                "CUDA_VISIBLE_DEVICES entries %s name no GPU that NVML reports on this host "
                "(it reports %d); they are counted as Ray counts them, but as logical GPUs "
                "that are not shared through the host GPU ledger",
                unresolved,
                len(devices),
            )
    names = [device.name if device is not None else None for _, device, _ in chosen]
    first_name = next((n for n in names if n), None)
    return GpuInventory(
        count=len(chosen),
        ids=[gpu_id for gpu_id, _, _ in chosen],
        ids_are_ints=ids_are_ints,
        names=names,
        uuids=[uuid if device is not None else None for _, device, uuid in chosen],
        device_keys=[_device_key(device, uuid) for _, device, uuid in chosen],
        accelerator_type=accelerator_type_from_name(first_name),
        physical_count=len(devices),
    )


# ---------------------------------------------------------------------------------------------
# NVML


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).strip() or None


def _call(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or None if it raises: one device's missing detail is not fatal."""
    try:
        return fn(*args)
    except Exception as e:  # NVMLError and anything a broken binding raises
        logger.debug("NVML call %s failed: %r", getattr(fn, "__name__", fn), e)
        return None


def _mig_uuids(nvml: Any, handle: Any) -> tuple[str, ...]:
    max_count = getattr(nvml, "nvmlDeviceGetMaxMigDeviceCount", None)
    get_handle = getattr(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", None)
    if max_count is None or get_handle is None:
        return ()
    uuids = []
    for i in range(int(_call(max_count, handle) or 0)):
        mig = _call(get_handle, handle, i)  # NVMLError_NotFound for an empty slot
        uuid = _text(_call(nvml.nvmlDeviceGetUUID, mig)) if mig is not None else None
        if uuid:
            uuids.append(uuid)
    return tuple(uuids)


def _import_pynvml() -> Any:
    try:
        with warnings.catch_warnings():
            # The "pynvml" distribution warns on import that it is deprecated in favour of
            # nvidia-ml-py, which installs the same module; the user cannot act on it here.
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            import pynvml
    except Exception as e:  # ImportError, or a broken install
        logger.debug("pynvml is not importable (%r): no GPUs detected", e)
        return None
    return pynvml


def _query_devices(nvml: NvmlBackend | None, with_mig: bool) -> list[_Device]:
    """NVML's devices; [] when NVML is missing, fails to start, or cannot count."""
    if nvml is None:
        nvml = _import_pynvml()
        if nvml is None:
            return []
    try:
        nvml.nvmlInit()
    except Exception as e:
        logger.debug("nvmlInit failed (%r): no GPUs detected", e)
        return []
    try:
        count = int(nvml.nvmlDeviceGetCount())
        devices = []
        for index in range(count):
            handle = _call(nvml.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                devices.append(_Device(index))
                continue
            devices.append(
                _Device(
                    index,
                    name=_text(_call(nvml.nvmlDeviceGetName, handle)),
                    uuid=_text(_call(nvml.nvmlDeviceGetUUID, handle)),
                    mig_uuids=_mig_uuids(nvml, handle) if with_mig else (),
                )
            )
        return devices
    except Exception as e:
        logger.debug("NVML could not count devices (%r): no GPUs detected", e)
        return []
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


class _FromEnvironment:
    def __repr__(self) -> str:
        return "<from the environment>"


_FROM_ENV: Any = _FromEnvironment()


def detect_gpus(
    nvml: NvmlBackend | None = None, cuda_visible_devices: str | None = _FROM_ENV
) -> GpuInventory:
    """The GPUs this node sees. Never raises: no pynvml or no driver means 0 GPUs.

    Args:
        nvml: the NVML binding to ask; None imports ``pynvml`` lazily. Tests pass a double.
        cuda_visible_devices: the ``CUDA_VISIBLE_DEVICES`` value the node starts with; by
            default the process's own (read through ``config``). None means not set.

    Example:
        >>> inv = detect_gpus(cuda_visible_devices="1,3")  # doctest: +SKIP
        >>> inv.count, inv.ids, inv.ids_are_ints, inv.accelerator_type  # doctest: +SKIP
        (2, ['1', '3'], False, 'H100')
    """
    if cuda_visible_devices is _FROM_ENV:
        cuda_visible_devices = config.cuda_visible_devices()
    visible = parse_visible_devices(cuda_visible_devices)
    with_mig = visible is not None and any(entry.startswith("MIG-") for entry in visible)
    return inventory_from_devices(_query_devices(nvml, with_mig), visible)
