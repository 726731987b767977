"""NCCL's side of the profiler plugin's C ABI, as NCCL 2.26 (v3), 2.27 (v4), 2.28 (v5), 2.29-2.30
(v6) and 2.31 (v7) call it: the exported structs, the event descriptors, and one communicator's
collectives played event by event (the host's collective start and stop, then each kernel
channel's start, from v7 its kernel phases where the kernel was symmetric (each started, its GPU
timer at stop recorded, stopped, before the channel stops: NCCL's src/plugin/profiler.cc), its
GPU timer at stop, and its stop, as NCCL's proxy or profiler thread reports them)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from autotune_nccl._library import library_path
from autotune_nccl.played import ok
from autotune_nccl.profiler import PHASES

GROUP, COLL, PROXY_OP, KERNEL_CH = 1 << 0, 1 << 1, 1 << 3, 1 << 6
KERNEL_PHASE = 1 << 15  # ncclProfileKernelPhase (v7)
KERNEL_CH_STOP = 22  # ncclProfilerKernelChStop
KERNEL_PHASE_STOP = 31  # ncclProfilerKernelPhaseStop (v7)
#: A symmetric all-reduce's phases as the checks play them: per channel of two, each phase's
#: (start, stop) GPU timers in ns, within the channel's (1_000, 41_000) and (3_000, 52_000).
SYMMETRIC_PHASES = [[(1_000, 3_000), (3_000, 30_000), (30_000, 41_000)],
          [(3_000, 4_000), (4_000, 45_000), (45_000, 52_000)]]  # fmt: skip
VERSIONS = ("v3", "v4", "v5", "v6", "v7")
#: The NCCL release that loads each symbol first (its newest profiler).
NCCL_OF = {"v3": "2.26", "v4": "2.27", "v5": "2.28", "v6": "2.30", "v7": "2.31"}


class CollV3(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("commHash", ctypes.c_uint64),
        ("seqNumber", ctypes.c_uint64),
        ("func", ctypes.c_char_p),
        ("sendBuff", ctypes.c_void_p),
        ("recvBuff", ctypes.c_void_p),
        ("count", ctypes.c_size_t),
        ("root", ctypes.c_int),
        ("datatype", ctypes.c_char_p),
        ("nMaxChannels", ctypes.c_uint8),
        ("nWarps", ctypes.c_uint8),
        ("algo", ctypes.c_char_p),
        ("proto", ctypes.c_char_p),
    ]


class CollV4(ctypes.Structure):
    _fields_ = [
        ("seqNumber", ctypes.c_uint64),
        ("func", ctypes.c_char_p),
        ("sendBuff", ctypes.c_void_p),
        ("recvBuff", ctypes.c_void_p),
        ("count", ctypes.c_size_t),
        ("root", ctypes.c_int),
        ("datatype", ctypes.c_char_p),
        ("nChannels", ctypes.c_uint8),
        ("nWarps", ctypes.c_uint8),
        ("algo", ctypes.c_char_p),
        ("proto", ctypes.c_char_p),
    ]


class CollV5(ctypes.Structure):
    _fields_ = [*CollV4._fields_, ("parentGroup", ctypes.c_void_p)]


class CollV7(ctypes.Structure):
    """NCCL 2.31's profiler_v7.h: v5's collective, then the kernel variant, whether it is a
    symmetric kernel, and the call's user tag."""

    _fields_ = [
        *CollV5._fields_,
        ("kernelVariant", ctypes.c_char_p),
        ("isSymColl", ctypes.c_bool),
        ("userTag", ctypes.c_uint64),
    ]


class KernelPhase(ctypes.Structure):
    _fields_ = [
        ("channelId", ctypes.c_uint8),
        ("phaseId", ctypes.c_uint8),
        ("phaseName", ctypes.c_char_p),
        ("pTimer", ctypes.c_uint64),
    ]


class KernelChV3(ctypes.Structure):
    _fields_ = [("channelId", ctypes.c_uint8)]


class KernelChV4(ctypes.Structure):
    _fields_ = [("channelId", ctypes.c_uint8), ("pTimer", ctypes.c_uint64)]


class ProxyOp(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_int),
        ("channelId", ctypes.c_uint8),
        ("peer", ctypes.c_int),
        ("nSteps", ctypes.c_int),
        ("chunkSize", ctypes.c_int),
        ("isSend", ctypes.c_int),
    ]


class CeColl(ctypes.Structure):
    """v6's copy-engine collective: the union's largest member, so v6's descriptor has its size."""

    _fields_ = [
        ("seqNumber", ctypes.c_uint64),
        ("func", ctypes.c_char_p),
        ("sendBuff", ctypes.c_void_p),
        ("recvBuff", ctypes.c_void_p),
        ("count", ctypes.c_size_t),
        ("root", ctypes.c_int),
        ("datatype", ctypes.c_char_p),
        ("syncStrategy", ctypes.c_char_p),
        ("intraBatchSync", ctypes.c_bool),
        ("batchSize", ctypes.c_uint32),
        ("numBatches", ctypes.c_uint32),
        ("ceSeqNum", ctypes.c_uint32),
        ("stream", ctypes.c_void_p),
    ]


class _U3(ctypes.Union):
    _fields_ = [("coll", CollV3), ("proxyOp", ProxyOp), ("kernelCh", KernelChV3)]


class _U4(ctypes.Union):
    _fields_ = [("coll", CollV4), ("proxyOp", ProxyOp), ("kernelCh", KernelChV4)]


class _U5(ctypes.Union):
    _fields_ = [("coll", CollV5), ("proxyOp", ProxyOp), ("kernelCh", KernelChV4)]


class _U6(ctypes.Union):
    _fields_ = [*_U5._fields_, ("ceColl", CeColl)]


class CeCollV7(ctypes.Structure):
    _fields_ = [*CeColl._fields_, ("userTag", ctypes.c_uint64)]


class _U7(ctypes.Union):
    _fields_ = [
        ("coll", CollV7),
        ("proxyOp", ProxyOp),
        ("kernelCh", KernelChV4),
        ("ceColl", CeCollV7),
        ("kernelPhase", KernelPhase),
    ]


class DescrV3(ctypes.Structure):
    _anonymous_ = ("u",)
    _fields_ = [
        ("type", ctypes.c_uint8),
        ("parentObj", ctypes.c_void_p),
        ("rank", ctypes.c_int),
        ("u", _U3),
    ]


class DescrV4(ctypes.Structure):
    _anonymous_ = ("u",)
    _fields_ = [*DescrV3._fields_[:3], ("u", _U4)]


class DescrV5(ctypes.Structure):
    _anonymous_ = ("u",)
    _fields_ = [
        ("type", ctypes.c_uint64),
        ("parentObj", ctypes.c_void_p),
        ("rank", ctypes.c_int),
        ("u", _U5),
    ]


class DescrV6(ctypes.Structure):
    _anonymous_ = ("u",)
    _fields_ = [*DescrV5._fields_[:3], ("u", _U6)]


class DescrV7(ctypes.Structure):
    _anonymous_ = ("u",)
    _fields_ = [*DescrV5._fields_[:3], ("u", _U7)]


class StateArgs(ctypes.Union):
    """ncclProfilerEventStateArgs v4-v6: the kernel channel's GPU timer at stop is the first."""

    _fields_ = [("pTimer", ctypes.c_uint64), ("transSize", ctypes.c_size_t)]


_PP = ctypes.POINTER(ctypes.c_void_p)
_STOP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_RECORD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
_FINAL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_LOG = ctypes.c_void_p


def _api(init: type, descr: type) -> type[ctypes.Structure]:
    start = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, _PP, ctypes.POINTER(descr))
    return type(
        f"Profiler{descr.__name__}",
        (ctypes.Structure,),
        {
            "_fields_": [
                ("name", ctypes.c_char_p),
                ("init", init),
                ("startEvent", start),
                ("stopEvent", _STOP),
                ("recordEventState", _RECORD),
                ("finalize", _FINAL),
            ]
        },
    )


_INT_P = ctypes.POINTER(ctypes.c_int)
INIT_V3 = ctypes.CFUNCTYPE(ctypes.c_int, _PP, _INT_P)
INIT_V4 = ctypes.CFUNCTYPE(
    ctypes.c_int, _PP, _INT_P, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_int,
    ctypes.c_int, _LOG,
)  # fmt: skip
INIT_V5 = ctypes.CFUNCTYPE(
    ctypes.c_int, _PP, ctypes.c_uint64, _INT_P, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
    ctypes.c_int, _LOG,
)  # fmt: skip
API = {
    "v3": (_api(INIT_V3, DescrV3), DescrV3),
    "v4": (_api(INIT_V4, DescrV4), DescrV4),
    "v5": (_api(INIT_V5, DescrV5), DescrV5),
    "v6": (_api(INIT_V5, DescrV6), DescrV6),
    "v7": (_api(INIT_V5, DescrV7), DescrV7),
}


def profiler(version: str) -> ctypes.Structure:
    """The struct the library exports as ``ncclProfiler_<version>``, as that NCCL finds it."""
    struct, _ = API[version]
    return struct.in_dll(ctypes.CDLL(library_path()), f"ncclProfiler_{version}")


@dataclass
class Played:
    """One collective as played: what NCCL said, and the GPU timers of its channels."""

    seq: int
    nbytes: int
    timers: list[tuple[int, int]]


class ProfiledComm:
    """One communicator as a given NCCL drives the profiler."""

    def __init__(
        self, version: str, comm_id: int, nranks: int = 2, rank: int = 0, nnodes: int = 1
    ) -> None:
        self.version = version
        self.api = profiler(version)
        self.descr = API[version][1]
        self.comm_id, self.rank = comm_id, rank
        self.ctx = ctypes.c_void_p()
        mask = ctypes.c_int(0)
        name = b"played"
        if version == "v3":
            rc = self.api.init(ctypes.byref(self.ctx), ctypes.byref(mask))
        elif version == "v4":
            rc = self.api.init(
                ctypes.byref(self.ctx), ctypes.byref(mask), name, comm_id, nnodes, nranks, rank,
                None,
            )  # fmt: skip
        else:
            rc = self.api.init(
                ctypes.byref(self.ctx), comm_id, ctypes.byref(mask), name, nnodes, nranks, rank,
                None,
            )  # fmt: skip
        ok(rc)
        self.mask = mask.value
        self.seq: dict[str, int] = {}

    def start(self, event: ctypes.Structure) -> ctypes.c_void_p:
        handle = ctypes.c_void_p(0xDEAD)  # NCCL's slot holds garbage until the plugin writes
        ok(self.api.startEvent(self.ctx, ctypes.byref(handle), ctypes.byref(event)))
        return handle

    def stop(self, handle: ctypes.c_void_p | int | None) -> None:
        ok(self.api.stopEvent(handle))

    def record_stop(self, handle: ctypes.c_void_p, timer: int, state: int = KERNEL_CH_STOP) -> None:
        args = StateArgs(pTimer=timer)
        ok(self.api.recordEventState(handle, state, ctypes.byref(args)))

    def coll_event(
        self,
        func: str,
        count: int,
        dtype: str = "ncclFloat32",
        algo: str = "RING",
        proto: str = "SIMPLE",
        channels: int = 2,
        seq: int | None = None,
        variant: str = "",
        symmetric: bool = False,
        tag: int = 0,
    ) -> ctypes.Structure:
        e = self.descr()
        e.type = COLL
        e.rank = self.rank
        if seq is None:
            seq = self.seq.get(func, 0)
            self.seq[func] = seq + 1
        c = e.coll
        c.seqNumber, c.func, c.count, c.datatype = seq, func.encode(), count, dtype.encode()
        c.algo, c.proto = algo.encode(), proto.encode()
        if self.version == "v3":
            c.commHash, c.nMaxChannels = self.comm_id, channels
        else:
            c.nChannels = channels
        if self.version == "v7":
            c.kernelVariant, c.isSymColl, c.userTag = variant.encode(), symmetric, tag
        return e

    def channel_event(
        self, parent: ctypes.c_void_p | int | None, channel: int, timer: int
    ) -> ctypes.Structure:
        e = self.descr()
        e.type = KERNEL_CH
        e.parentObj = parent.value if isinstance(parent, ctypes.c_void_p) else parent
        e.kernelCh.channelId = channel
        if self.version != "v3":
            e.kernelCh.pTimer = timer
        return e

    def start_channel(
        self, parent: ctypes.c_void_p | int | None, channel: int, timer: int
    ) -> ctypes.c_void_p:
        return self.start(self.channel_event(parent, channel, timer))

    def stop_channel(self, handle: ctypes.c_void_p, timer: int) -> None:
        if self.version != "v3":  # v3 has no timer: NCCL 2.26 stops the event, nothing more
            self.record_stop(handle, timer)
        self.stop(handle)

    def phase(
        self, parent: ctypes.c_void_p, channel: int, phase: int, start: int, stop: int
    ) -> None:
        """One kernel phase of a channel, as NCCL 2.31 fires it: start, stop state, stop."""
        e = self.descr()
        e.type = KERNEL_PHASE
        e.parentObj = parent.value
        p = e.kernelPhase
        name = PHASES[phase] if phase < len(PHASES) else "unknown"
        p.channelId, p.phaseId, p.phaseName, p.pTimer = channel, phase, name.encode(), start
        handle = self.start(e)
        if handle.value is not None:
            self.record_stop(handle, stop, KERNEL_PHASE_STOP)
            self.stop(handle)

    def proxy_op(self, parent: ctypes.c_void_p) -> ctypes.c_void_p:
        e = self.descr()
        e.type = PROXY_OP
        e.parentObj = parent.value
        e.proxyOp.channelId = 0
        return self.start(e)

    def collective(
        self,
        func: str = "AllReduce",
        count: int = 1 << 18,
        timers: list[tuple[int, int]] | None = None,
        phases: list[list[tuple[int, int]]] | None = None,
        **kw: object,
    ) -> Played:
        """A whole collective: NCCL starts and stops the task on the launching thread, then the
        proxy thread reports each channel (with a proxy op beside it, which the plugin ignores);
        ``phases`` (v7): per channel, each phase's GPU timers, fired before the channel stops."""
        timers = timers if timers is not None else [(1_000, 41_000), (3_000, 52_000)]
        event = self.coll_event(func, count, channels=len(timers), **kw)  # type: ignore[arg-type]
        seq = event.coll.seqNumber
        handle = self.start(event)
        self.stop(handle)  # the host stops the task right after the launch
        for ch, (start, stop) in enumerate(timers):
            op = self.proxy_op(handle)
            k = self.start_channel(handle, ch, start)
            for i, (p_start, p_stop) in enumerate(phases[ch] if phases else ()):
                self.phase(k, ch, i, p_start, p_stop)
            self.stop_channel(k, stop)
            self.stop(op)
        return Played(seq, count * DTYPE_SIZE.get(event.coll.datatype.decode(), 0), timers)

    def finalize(self) -> None:
        ok(self.api.finalize(self.ctx))


DTYPE_SIZE = {"ncclFloat32": 4, "ncclBfloat16": 2, "ncclFloat16": 2, "ncclInt8": 1}
