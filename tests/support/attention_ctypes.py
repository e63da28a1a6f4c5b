"""ctypes mirrors of csrc/attention.h's structs (Shape, Intervention, Stats, Batch) and the
pointer helper, shared by tests/test_attention_variants.py and benchmarks/bench_attention.py,
which call the attention kernel compiled into a shared library."""
import ctypes as C

f32p = C.POINTER(C.c_float)
f64p = C.POINTER(C.c_double)
i64p = C.POINTER(C.c_int64)
u8p = C.POINTER(C.c_uint8)


class Shape(C.Structure):
    _fields_ = [("T", C.c_int64), ("n_heads", C.c_int64), ("n_kv_heads", C.c_int64), ("head_dim", C.c_int64),
                ("scale", C.c_float), ("bidirectional", C.c_int), ("window", C.c_int64), ("softcap", C.c_float),
                ("variant", C.c_int), ("sinks", f32p)]  # variant 0 (softmax) and no sinks unless given


class Intervention(C.Structure):
    _fields_ = [("mask_first", u8p), ("zero_first_value", u8p), ("head_scale", f32p), ("key_start", i64p),
                ("keep_first", C.c_int)]


class Stats(C.Structure):
    _fields_ = [("importance", f32p), ("to_first", f32p), ("entropy", f32p)]


class Batch(C.Structure):
    _fields_ = [("B", C.c_int64), ("T_pad", C.c_int64), ("off", i64p), ("len", i64p),
                ("probs", C.POINTER(f32p)), ("importance", C.POINTER(f32p)), ("to_first", C.POINTER(f32p)),
                ("entropy", C.POINTER(f32p)), ("vt", f32p), ("partial", f64p), ("scratch", f32p),
                ("task_off", i64p), ("part_off", i64p),
                ("prologue", C.c_void_p), ("prologue_arg", C.c_void_p)]  # NULL: no row prologue


def ptr(a, t=f32p):
    return None if a is None else a.ctypes.data_as(t)
