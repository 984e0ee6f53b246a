"""Small numpy-only safetensors reader/writer and MLX affine dequantization.

Written from the format description (docs/design.md §4.4, §5): 8-byte little-endian
header length, JSON header with dtype/shape/data_offsets, raw little-endian data.
Offsets may be unaligned (MLX's writer does not pad), so tensors are copied out
of the file bytes rather than viewed in place.  BF16 is widened to float32 by
``uint16 << 16``.
"""
import glob
import json
import os
import struct

import numpy as np

_NP = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "U8": np.uint8,
       "I16": np.int16, "U16": np.uint16, "I32": np.int32, "U32": np.uint32, "I64": np.int64,
       "U64": np.uint64, "BOOL": np.bool_}


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """Round-to-nearest-even float32 -> bf16 bits (uint16)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    rounded = u + 0x7FFF + ((u >> 16) & 1)
    out = (rounded >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def read_file(path, raw=False):
    """Returns {name: np.ndarray}.  BF16 -> float32 unless raw (then uint16 with dtype tag)."""
    hdr, base = read_header(path)
    out = {}
    with open(path, "rb") as f:
        buf = f.read()
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dt = info["dtype"]
        shape = info["shape"]
        chunk = buf[base + b: base + e]
        if dt == "BF16":
            a = np.frombuffer(chunk, dtype="<u2").reshape(shape).copy()
            out[name] = a if raw else bf16_to_f32(a)
        elif dt in _NP:
            out[name] = np.frombuffer(chunk, dtype=np.dtype(_NP[dt]).newbyteorder("<")).reshape(shape).copy()
        else:
            raise ValueError(f"{path}: unsupported dtype {dt} for {name}")
    return out


def write_file(path, tensors, metadata=None, align=8):
    """tensors: {name: (dtype_str, np.ndarray)} or {name: np.ndarray (dtype inferred)}.
    align=8 pads the header like the HF writer; align=1 writes unpadded like MLX."""
    items = []
    for name, v in tensors.items():
        if isinstance(v, tuple):
            dt, arr = v
        else:
            arr = v
            dt = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.uint32): "U32",
                  np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}[arr.dtype]
        if dt == "BF16":
            data = (arr if arr.dtype == np.uint16 else f32_to_bf16(arr)).astype("<u2").tobytes()
        else:
            data = np.ascontiguousarray(arr).astype(np.dtype(_NP[dt]).newbyteorder("<")).tobytes()
        items.append((name, dt, list(arr.shape), data))
    hdr, off = {}, 0
    if metadata:
        hdr["__metadata__"] = metadata
    for name, dt, shape, data in items:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    hj = json.dumps(hdr, separators=(",", ":")).encode()
    if align > 1:
        hj += b" " * ((-len(hj)) % align)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for _, _, _, data in items:
            f.write(data)


# ---------------------------------------------------------------------------------------------
# MLX affine quantization (docs/design.md §5)
# ---------------------------------------------------------------------------------------------

def unpack_bits(words, bits, n):
    """words uint32 [..., W] -> uint32 values [..., n]: little-endian bit stream per row."""
    lead = words.shape[:-1]
    by = np.ascontiguousarray(words.astype("<u4")).view(np.uint8).reshape(*lead, -1)
    bitarr = np.unpackbits(by, axis=-1, bitorder="little")[..., :n * bits]
    bitarr = bitarr.reshape(*lead, n, bits).astype(np.uint32)
    return (bitarr << np.arange(bits, dtype=np.uint32)).sum(-1).astype(np.uint32)


def pack_bits(q, bits):
    """inverse of unpack_bits: q [..., n] ints in [0, 2^bits) -> uint32 [..., n*bits/32]."""
    lead = q.shape[:-1]
    n = q.shape[-1]
    assert (n * bits) % 32 == 0
    b = ((q[..., None].astype(np.uint32) >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
    by = np.packbits(b.reshape(*lead, n * bits), axis=-1, bitorder="little")
    return np.ascontiguousarray(by).view("<u4").reshape(*lead, n * bits // 32).astype(np.uint32)


def dequantize(w, scales, biases, bits, group_size):
    n = scales.shape[-1] * group_size
    q = unpack_bits(w, bits, n).astype(np.float32)
    q = q.reshape(*scales.shape, group_size)
    return (q * scales[..., None].astype(np.float32) + biases[..., None].astype(np.float32)).reshape(
        *scales.shape[:-1], n)


def quantize(w, bits, group_size):
    """MLX-style affine quantization of float32 w [..., in] -> (uint32 words, scales, biases)."""
    shp = w.shape
    g = w.reshape(*shp[:-1], shp[-1] // group_size, group_size).astype(np.float32)
    wmax, wmin = g.max(-1), g.min(-1)
    nq = (1 << bits) - 1
    scale = np.maximum((wmax - wmin) / nq, 1e-7)
    side = np.abs(wmin) > np.abs(wmax)
    scale = np.where(side, scale, -scale)     # the larger-magnitude extreme maps exactly
    edge = np.where(side, wmin, wmax)
    q0 = np.rint(edge / scale)
    scale = np.where(q0 != 0, edge / np.where(q0 != 0, q0, 1), scale)
    bias = np.where(q0 != 0, edge, 0.0)
    q = np.clip(np.rint((g - bias[..., None]) / scale[..., None]), 0, nq).astype(np.uint32)
    return pack_bits(q.reshape(shp), bits), scale.astype(np.float32), bias.astype(np.float32)


def _qparams(module, qcfg, w, scales):
    bits, gs = None, None
    if qcfg:
        o = qcfg.get(module)
        if isinstance(o, dict):
            bits, gs = o.get("bits"), o.get("group_size")
        if bits is None:
            bits = qcfg.get("bits")
        if gs is None:
            gs = qcfg.get("group_size")
    # cross-check against the shapes (and derive when config is silent)
    n_in_words = w.shape[-1]
    ngroups = scales.shape[-1]
    for b in (bits,) if bits else (2, 3, 4, 5, 6, 8):
        for g in (gs,) if gs else (32, 64, 128):
            if n_in_words * 32 == b * g * ngroups:
                return b, g
    raise ValueError(f"{module}: cannot determine bits/group_size (config {bits}/{gs}, "
                     f"packed {n_in_words} words, {ngroups} groups)")


def read_dir_tensors(model_dir, qcfg=None):
    """All tensors of a checkpoint directory as float32 (quantized modules dequantized).
    Reads every model*.safetensors file (covers shards and a model-mtp.safetensors sidecar)."""
    files = set(glob.glob(os.path.join(model_dir, "model*.safetensors")))
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):   # shards listed in the index, whatever their names
        with open(idx) as f:
            files |= {os.path.join(model_dir, v) for v in json.load(f).get("weight_map", {}).values()}
    files = sorted(files)
    if not files:
        raise FileNotFoundError(f"no model*.safetensors in {model_dir}")
    t = {}
    for f in files:
        t.update(read_file(f))
    out = {}
    for k, v in t.items():
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        if k.endswith(".weight") and k[:-7] + ".scales" in t:
            mod = k[:-7]
            bits, gs = _qparams(mod, qcfg, v, t[mod + ".scales"])
            out[k] = dequantize(v, t[mod + ".scales"], t[mod + ".biases"], bits, gs)
        else:
            out[k] = v.astype(np.float32) if v.dtype != np.float32 else v
    return out
