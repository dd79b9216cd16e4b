"""The C API of the runtime (native/runtime/ditto.h) from Python, through ctypes.

A build directory holds ``libditto.so`` (``ditto build`` links it beside ``ditto-run``);
``Model.open(build_dir)`` loads it with the build's model file. Every call into the library goes
through ctypes' ``CDLL``, which releases the GIL for the duration of the call, so a session
evaluating in one thread does not stop the others (evaluations themselves are serialised by a
lock inside the library, docs/RUNTIME.md "C API").

Errors of the library come back as ``RuntimeAPIError`` (a DittoError) carrying the status code
and the library's message.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from ditto_core.base.errors import DittoError

#: File name of the shared library inside a build directory.
LIBRARY_NAME = "libditto.so"

#: DittoStatus values (native/runtime/ditto.h).
OK, ERR_ARG, ERR_MODEL, ERR_INPUT, ERR_OOM = 0, 1, 2, 3, 5

LOGITS_NONE, LOGITS_LAST, LOGITS_ALL = 0, 1, 2

_ERRLEN = 1024


class RuntimeAPIError(DittoError):
    """A call of the C API failed: ``status`` is its DittoStatus, the message the library's."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class _Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in (
        "vocab_size", "max_seq_len", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim",
        "hidden_dim", "bos_id", "eos_id", "add_bos", "max_piece_bytes", "threads")] + [
        ("kernel", ctypes.c_char * 32)]


_P = ctypes.c_void_p
_I32P = ctypes.POINTER(ctypes.c_int32)
_F32P = ctypes.POINTER(ctypes.c_float)
_SIGNATURES = {
    "ditto_api_version": (ctypes.c_int, []),
    "ditto_model_open": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                        ctypes.POINTER(_P), ctypes.c_char_p, ctypes.c_size_t]),
    "ditto_model_free": (None, [_P]),
    "ditto_model_info": (None, [_P, ctypes.POINTER(_Info)]),
    "ditto_tokenize": (ctypes.c_long, [_P, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int,
                                       ctypes.c_int, _I32P, ctypes.c_size_t, ctypes.c_char_p,
                                       ctypes.c_size_t]),
    "ditto_token_find": (ctypes.c_int32, [_P, ctypes.c_char_p]),
    "ditto_token_is_eog": (ctypes.c_int, [_P, ctypes.c_int32]),
    "ditto_token_fim": (ctypes.c_int32, [_P, ctypes.c_int]),
    "ditto_token_is_control": (ctypes.c_int, [_P, ctypes.c_int32]),
    "ditto_detokenize": (ctypes.c_long, [_P, _I32P, ctypes.c_size_t, ctypes.c_int,
                                         ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                                         ctypes.c_size_t]),
    "ditto_token_piece": (ctypes.c_long, [_P, ctypes.c_int32, ctypes.c_char_p,
                                          ctypes.c_size_t]),
    "ditto_decoder_new": (ctypes.c_int, [_P, ctypes.POINTER(_P)]),
    "ditto_decoder_feed": (ctypes.c_long, [_P, ctypes.c_int32, ctypes.c_int, ctypes.c_char_p,
                                           ctypes.c_size_t]),
    "ditto_decoder_flush": (ctypes.c_long, [_P, ctypes.c_char_p, ctypes.c_size_t]),
    "ditto_decoder_free": (None, [_P]),
    "ditto_session_new": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(_P),
                                         ctypes.c_char_p, ctypes.c_size_t]),
    "ditto_session_new_kv": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                            ctypes.c_char_p, ctypes.POINTER(_P),
                                            ctypes.c_char_p, ctypes.c_size_t]),
    "ditto_session_free": (None, [_P]),
    "ditto_session_pos": (ctypes.c_int, [_P]),
    "ditto_session_ctx": (ctypes.c_int, [_P]),
    "ditto_session_eval": (ctypes.c_int, [_P, _I32P, ctypes.c_int, ctypes.c_int, _F32P,
                                          ctypes.c_char_p, ctypes.c_size_t]),
    "ditto_session_truncate": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_char_p,
                                              ctypes.c_size_t]),
    "ditto_sampler_new": (ctypes.c_int, [_P, ctypes.c_float, ctypes.c_int, ctypes.c_float,
                                         ctypes.c_uint64, ctypes.POINTER(_P), ctypes.c_char_p,
                                         ctypes.c_size_t]),
    "ditto_sampler_free": (None, [_P]),
    "ditto_sample": (ctypes.c_int32, [_P, _F32P]),
    "ditto_sampler_set_min_p": (ctypes.c_int, [_P, ctypes.c_float, ctypes.c_char_p,
                                               ctypes.c_size_t]),
    "ditto_argmax": (ctypes.c_int32, [_P, _F32P]),
}

_libs: dict[str, ctypes.CDLL] = {}
_libs_lock = threading.Lock()


#: The KV cache element types (ditto_session_new_kv; llama.cpp's --cache-type-k/-v names).
KV_CACHE_TYPES = ("f32", "f16")

#: Functions a library of an older API version lacks, and the version that added them: such a
#: library still loads, and only what needs them is refused.
_SINCE = {"ditto_session_new_kv": 3}


def load_library(path: str | Path) -> ctypes.CDLL:
    """The shared library at ``path`` with every function's ctypes signature set (loaded once
    per path). Raises DittoError when it cannot be loaded or lacks a function of the API."""
    path = str(Path(path).resolve())
    with _libs_lock:
        if path in _libs:
            return _libs[path]
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise DittoError(f"{path}: cannot load the runtime library: {exc}") from None
        for name, (res, args) in _SIGNATURES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                if name in _SINCE:
                    continue
                raise DittoError(f"{path}: the runtime library lacks {name}; rebuild with "
                                 "`ditto build`") from None
            fn.restype, fn.argtypes = res, args
        _libs[path] = lib
        return lib


def _check(status: int, err) -> None:
    if status != OK:
        raise RuntimeAPIError(status, err.value.decode("utf-8", "replace"))


def _i32(ids: Sequence[int]) -> np.ndarray:
    """``ids`` as a contiguous int32 array. Raises RuntimeAPIError (ERR_INPUT) for an id outside
    int32, which a cast would wrap into another id."""
    try:
        arr = np.asarray(ids, dtype=np.int64)
    except OverflowError:  # wider than 64 bits
        arr = None
    if arr is None or (arr.size and (arr.min() < -2**31 or arr.max() >= 2**31)):
        i, v = next((i, v) for i, v in enumerate(ids) if not -2**31 <= int(v) < 2**31)
        raise RuntimeAPIError(ERR_INPUT, f"token id {v} at index {i} is out of range")
    return np.ascontiguousarray(arr.astype(np.int32))


def _utf8(text: str) -> bytes:
    """``text`` as UTF-8. Raises RuntimeAPIError (ERR_INPUT) for a lone surrogate (JSON's
    "\\ud800" escapes give one), which has no UTF-8 form."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RuntimeAPIError(ERR_INPUT, f"text is not valid Unicode: lone surrogate "
                                         f"U+{ord(text[exc.start]):04X} at index "
                                         f"{exc.start}") from None


class Model:
    """A model file opened through the C API, with its tokenizer.

    ``info`` (dict): vocab_size, max_seq_len, dim, n_layers, n_heads, n_kv_heads, head_dim,
    hidden_dim, bos_id, eos_id (-1: none), add_bos, max_piece_bytes, threads, kernel.
    """

    def __init__(self, lib: ctypes.CDLL, handle: int, path: Path):
        self.lib, self._h, self.path = lib, handle, path
        info = _Info()
        lib.ditto_model_info(handle, ctypes.byref(info))
        self.info = {n: getattr(info, n) for n, _ in _Info._fields_ if n != "kernel"}
        self.info["kernel"] = info.kernel.decode()
        self.vocab_size = self.info["vocab_size"]
        self.max_seq_len = self.info["max_seq_len"]
        self._piece_cap = self.info["max_piece_bytes"] + 16

    @classmethod
    def open(cls, model_path: str | Path, library: str | Path, *, threads: int = 0,
             kernel: str | None = None) -> "Model":
        """Open ``model_path`` (a .ditto file) with the runtime library ``library``.
        ``threads``: OpenMP threads per evaluation (0: the OpenMP default); ``kernel``: the
        GEMV kernel table name (None: the best this CPU runs). Raises RuntimeAPIError
        (bad model file, unknown kernel) or DittoError (library not loadable)."""
        lib = load_library(library)
        h = _P()
        err = ctypes.create_string_buffer(_ERRLEN)
        _check(lib.ditto_model_open(str(model_path).encode(), (kernel or "").encode(),
                                    int(threads), ctypes.byref(h), err, _ERRLEN), err)
        return cls(lib, h.value, Path(model_path))

    def close(self) -> None:
        """Free the model (its sessions must be closed first)."""
        if self._h:
            self.lib.ditto_model_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- tokenizer -------------------------------------------------------------------------
    def tokenize(self, text: str | bytes, *, add_bos: bool = False,
                 parse_special: bool = False) -> list[int]:
        """Token ids of ``text`` (str or UTF-8 bytes) by the model's own tokenizer.
        ``parse_special``: control-token texts become their tokens. Raises RuntimeAPIError
        for invalid UTF-8 (a str with a lone surrogate)."""
        data = _utf8(text) if isinstance(text, str) else bytes(text)
        err = ctypes.create_string_buffer(_ERRLEN)
        cap = len(data) + 8
        while True:
            buf = (ctypes.c_int32 * cap)()
            n = self.lib.ditto_tokenize(self._h, data, len(data), int(parse_special),
                                        int(add_bos), buf, cap, err, _ERRLEN)
            if n < 0:
                raise RuntimeAPIError(ERR_INPUT, err.value.decode("utf-8", "replace"))
            if n <= cap:
                return list(buf[:n])
            cap = n

    def detokenize(self, ids: Sequence[int], *, show_special: bool = False) -> str:
        """The text of ``ids`` (str; invalid UTF-8 as U+FFFD). Raises RuntimeAPIError for an
        id out of range."""
        arr = _i32(ids)
        err = ctypes.create_string_buffer(_ERRLEN)
        cap = len(arr) * 8 + 64
        while True:
            out = ctypes.create_string_buffer(cap)
            n = self.lib.ditto_detokenize(self._h, arr.ctypes.data_as(_I32P), len(arr),
                                          int(show_special), out, cap, err, _ERRLEN)
            if n < 0:
                raise RuntimeAPIError(ERR_INPUT, err.value.decode("utf-8", "replace"))
            if n <= cap:
                return out.raw[:n].decode("utf-8", "replace")
            cap = n

    def piece(self, token_id: int) -> bytes:
        """The bytes of one token on its own (control tokens' text included). Raises
        RuntimeAPIError for an id out of range."""
        out = ctypes.create_string_buffer(self._piece_cap)
        n = self.lib.ditto_token_piece(self._h, int(token_id), out, self._piece_cap)
        if n < 0:
            raise RuntimeAPIError(ERR_INPUT, f"token id {token_id} is out of range "
                                             f"(vocab {self.vocab_size})")
        return out.raw[:n]

    def find_token(self, text: str) -> int:
        """Id of the token whose text is exactly ``text``, or -1."""
        return int(self.lib.ditto_token_find(self._h, text.encode("utf-8")))

    #: roles of ``fim_token`` (ditto_format.h DITTO_FIM_*)
    FIM_ROLES = ("prefix", "suffix", "middle", "pad", "repo", "sep")

    def fim_token(self, role: str) -> int:
        """The fill-in-the-middle token of ``role`` (``FIM_ROLES``) recorded in the model file
        at export, or -1."""
        return int(self.lib.ditto_token_fim(self._h, self.FIM_ROLES.index(role)))

    def is_eog(self, token_id: int) -> bool:
        """Whether ``token_id`` ends generation (the model file's end-of-generation set: EOS,
        end-of-turn / end-of-text tokens)."""
        return bool(self.lib.ditto_token_is_eog(self._h, int(token_id)))

    def is_control(self, token_id: int) -> bool:
        """Whether ``token_id`` is a control token (no text unless shown as special)."""
        return bool(self.lib.ditto_token_is_control(self._h, int(token_id)))

    def decoder(self) -> "Decoder":
        """A streaming decoder (``Decoder``) of this model's tokens."""
        return Decoder(self)

    # -- sessions and sampling -------------------------------------------------------------
    def session(self, n_ctx: int, n_batch: int = 256, cache_type_k: str = "f32",
                cache_type_v: str = "f32") -> "Session":
        """A new session: a KV cache of ``n_ctx`` positions, evaluating in tiles of up to
        ``n_batch`` tokens; keys and values stored as ``cache_type_k`` / ``cache_type_v``
        ("f32", or "f16": half the bytes, each rounded to nearest even; llama.cpp's
        --cache-type-k/-v names). Raises RuntimeAPIError (n_ctx above max_seq_len, a cache
        type that is neither, out of memory)."""
        return Session(self, n_ctx, n_batch, cache_type_k, cache_type_v)

    def sampler(self, temperature: float, top_k: int = 0, top_p: float = 1.0,
                seed: int = 0, min_p: float = 0.0) -> "Sampler":
        """A sampler (``Sampler``): temperature 0 is greedy argmax."""
        return Sampler(self, temperature, top_k, top_p, seed, min_p)

    def argmax(self, logits: np.ndarray) -> int:
        """Index of the largest logit (the first on ties); ``logits`` float32 [vocab_size]."""
        lg = np.ascontiguousarray(logits, dtype=np.float32)
        return int(self.lib.ditto_argmax(self._h, lg.ctypes.data_as(_F32P)))


class Decoder:
    """Streaming decoder: ``feed(id)`` returns the bytes that token completes (a UTF-8
    character split over tokens comes out whole, in the call of its last byte);
    ``flush()`` the bytes still pending."""

    def __init__(self, model: Model):
        self.model = model
        h = _P()
        if model.lib.ditto_decoder_new(model._h, ctypes.byref(h)) != OK:
            raise RuntimeAPIError(ERR_OOM, "out of memory")
        self._h = h.value
        self._buf = ctypes.create_string_buffer(model._piece_cap)

    def feed(self, token_id: int, show_special: bool = False) -> bytes:
        n = self.model.lib.ditto_decoder_feed(self._h, int(token_id), int(show_special),
                                              self._buf, self.model._piece_cap)
        if n < 0:
            raise RuntimeAPIError(ERR_INPUT, f"token id {token_id} is out of range")
        return self._buf.raw[:n]

    def flush(self) -> bytes:
        n = self.model.lib.ditto_decoder_flush(self._h, self._buf, self.model._piece_cap)
        return self._buf.raw[:n]

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            self.model.lib.ditto_decoder_free(h)
            self._h = None


class Session:
    """One KV cache of ``n_ctx`` positions (``ditto_session_*``). ``pos``: positions filled.

    Not thread-safe: one thread uses a session at a time (sessions of one model may be used
    by different threads at once; their evaluations take turns inside the library)."""

    def __init__(self, model: Model, n_ctx: int, n_batch: int = 256, cache_type_k: str = "f32",
                 cache_type_v: str = "f32"):
        self.model = model
        for name, t in (("cache_type_k", cache_type_k), ("cache_type_v", cache_type_v)):
            if t not in KV_CACHE_TYPES:  # as the library words it; also for one that predates it
                raise RuntimeAPIError(ERR_ARG, f"{name} {t!r} is not a KV cache type (f32, f16)")
        h = _P()
        err = ctypes.create_string_buffer(_ERRLEN)
        if hasattr(model.lib, "ditto_session_new_kv"):
            _check(model.lib.ditto_session_new_kv(model._h, int(n_ctx), int(n_batch),
                                                  cache_type_k.encode(), cache_type_v.encode(),
                                                  ctypes.byref(h), err, _ERRLEN), err)
        elif (cache_type_k, cache_type_v) == ("f32", "f32"):
            _check(model.lib.ditto_session_new(model._h, int(n_ctx), int(n_batch),
                                               ctypes.byref(h), err, _ERRLEN), err)
        else:
            raise DittoError(f"{model.lib._name}: this build's runtime library predates f16 KV "
                             "caches (API version 3); rebuild it with `ditto build`")
        self._h = h.value
        self.n_ctx = int(n_ctx)

    @property
    def pos(self) -> int:
        return int(self.model.lib.ditto_session_pos(self._h))

    def eval(self, tokens: Sequence[int], logits: str = "last") -> np.ndarray | None:
        """Append ``tokens`` (ints < vocab_size) at ``pos`` and return logits as float32:
        ``logits="last"`` → [vocab_size] of the last token, ``"all"`` → [n, vocab_size] (row t
        after token t), ``"none"`` → None. Raises RuntimeAPIError (context full, id out of
        range); nothing is evaluated then."""
        arr = _i32(tokens)
        n, vocab = len(arr), self.model.vocab_size
        mode = {"none": LOGITS_NONE, "last": LOGITS_LAST, "all": LOGITS_ALL}[logits]
        out = None
        if mode == LOGITS_LAST:
            out = np.empty(vocab, np.float32)
        elif mode == LOGITS_ALL:
            out = np.empty((n, vocab), np.float32)
        err = ctypes.create_string_buffer(_ERRLEN)
        _check(self.model.lib.ditto_session_eval(
            self._h, arr.ctypes.data_as(_I32P), n, mode,
            out.ctypes.data_as(_F32P) if out is not None else None, err, _ERRLEN), err)
        return out

    def truncate(self, n_keep: int) -> None:
        """Drop positions >= ``n_keep`` (0 <= n_keep <= pos)."""
        err = ctypes.create_string_buffer(_ERRLEN)
        _check(self.model.lib.ditto_session_truncate(self._h, int(n_keep), err, _ERRLEN), err)

    def close(self) -> None:
        if self._h:
            self.model.lib.ditto_session_free(self._h)
            self._h = None

    def __del__(self):
        if getattr(self, "_h", None):
            self.close()


class Sampler:
    """``ditto_sampler_*``: temperature (0 = greedy), top_k (<= 0: all), top_p (>= 1: all),
    seed (unsigned 64-bit), min_p (0: off; ``ditto_sampler_set_min_p``). Raises
    RuntimeAPIError for a negative temperature, top_p <= 0 or min_p outside [0, 1]."""

    def __init__(self, model: Model, temperature: float, top_k: int = 0, top_p: float = 1.0,
                 seed: int = 0, min_p: float = 0.0):
        self.model = model
        h = _P()
        err = ctypes.create_string_buffer(_ERRLEN)
        _check(model.lib.ditto_sampler_new(model._h, float(temperature), int(top_k),
                                           float(top_p), int(seed) & (2**64 - 1),
                                           ctypes.byref(h), err, _ERRLEN), err)
        self._h = h.value
        if min_p:
            _check(model.lib.ditto_sampler_set_min_p(self._h, float(min_p), err, _ERRLEN), err)

    def sample(self, logits: np.ndarray) -> int:
        """Next token id from ``logits`` float32 [vocab_size] (left unchanged)."""
        lg = np.ascontiguousarray(logits, dtype=np.float32)
        return int(self.model.lib.ditto_sample(self._h, lg.ctypes.data_as(_F32P)))

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            self.model.lib.ditto_sampler_free(h)
            self._h = None


def open_build(build_dir: str | Path, *, threads: int = 0, kernel: str | None = None) -> Model:
    """The model of a build directory opened through its ``libditto.so``. Raises DittoError
    naming the directory when it is not a build, or lacks the library (a build made before
    ``ditto build`` linked it: rebuild)."""
    from .run import find_build

    d = Path(build_dir)
    _exe, model_path, _meta = find_build(d)
    lib = d / LIBRARY_NAME
    if not lib.is_file():
        raise DittoError(f"{lib}: missing; this build predates the runtime library: rebuild it "
                         f"with `ditto build MODEL --quantizer kmeans --blas openblas -o {d}`")
    return Model.open(model_path, lib, threads=threads, kernel=kernel)
