#!/usr/bin/env python3
"""Golden vectors for github.com/mokopt/mokopt/kernel/mxfp8, from an independent
implementation (PyTorch), so the Go codec is checked against code it shares nothing with.

Usage:  python3 gen_golden.py OUT.json

What it computes (the MoK MXFP8 rule, see docs/kernel.md in the repository):
  amax = max |x| over a 1x32 block                      (float32)
  s    = max(amax / 448, 1e-12)                         (float32 tensor ops)
  e    = ceil(log2(s)), clamped to >= -127              (via torch.frexp; cross-checked
                                                         against the float32 bit rule)
  byte = e + 127
  q    = float8_e4m3fn(clamp(x * 2^-e, -448, 448))      (torch's own fp8 cast, RNE;
                                                         the clamp gives saturation, since
                                                         torch's cast maps |y| >= 480 to NaN)
Where CUDA is available every fp8 cast is repeated on the GPU and must agree bit for bit
with the CPU cast.

Everything that is a float32 is written as its exact bit pattern ("0x%08x"), never as a
decimal, so nothing is lost on the way to Go.
"""
import json
import math
import random
import struct
import sys

import torch

F32 = torch.float32
FP8 = torch.float8_e4m3fn
CUDA = torch.cuda.is_available()


def bits_to_f32(bits):
    signed = [b - (1 << 32) if b >= (1 << 31) else b for b in bits]
    return torch.tensor(signed, dtype=torch.int32).view(F32)


def f32_bits(t):
    return [v & 0xFFFFFFFF for v in t.contiguous().view(torch.int32).reshape(-1).tolist()]


def hx(b):
    return "0x%08x" % b


def py_f32_bits(v):
    """Bit pattern of the float32 nearest to the Python float v."""
    return struct.unpack("<I", struct.pack("<f", v))[0]


def next_up(bits):
    return bits + 1


def next_down(bits):
    return bits - 1


def cast_fp8(y):
    """float32 tensor (already clamped) -> uint8 codes, CPU cast checked against CUDA."""
    q = y.to(FP8).view(torch.uint8)
    if CUDA:
        qc = y.cuda().to(FP8).view(torch.uint8).cpu()
        if not torch.equal(q, qc):
            raise SystemExit("CPU and CUDA float8_e4m3fn casts disagree")
    return q


def scale_exponent(amax):
    """amax: 0-d float32 tensor. Returns (e, s) per the MoK rule."""
    s = torch.maximum(amax / torch.tensor(448.0, dtype=F32), torch.tensor(1e-12, dtype=F32))
    assert s.dtype == F32
    m, ex = torch.frexp(s)  # s = m * 2**ex, 0.5 <= m < 1
    e = int(ex) - 1 if float(m) == 0.5 else int(ex)
    e = max(e, -127)
    # Cross-check with the float32 bit rule (s is never subnormal: s >= 1e-12).
    b = f32_bits(s.reshape(1))[0]
    e_bits = ((b >> 23) & 0xFF) - 127 + (1 if b & 0x7FFFFF else 0)
    if max(e_bits, -127) != e:
        raise SystemExit("frexp and bit rule disagree for s=%r" % float(s))
    return e, s


def quantize_rows(x):
    """x: float32 [R, C], C % 32 == 0. Returns (codes uint8 [R, C], scale bytes [R, C/32])."""
    R, C = x.shape
    blocks = x.reshape(R, C // 32, 32)
    codes = torch.empty((R, C // 32, 32), dtype=torch.uint8)
    scales = torch.empty((R, C // 32), dtype=torch.int64)
    for r in range(R):
        for c in range(C // 32):
            blk = blocks[r, c]
            e, _ = scale_exponent(blk.abs().max())
            inv = torch.tensor(math.ldexp(1.0, -e), dtype=F32)  # exact power of two
            y = torch.clamp(blk * inv, -448.0, 448.0)
            codes[r, c] = cast_fp8(y)
            scales[r, c] = e + 127
    return codes.reshape(R, C), scales


def block_case(name, values_bits):
    assert len(values_bits) == 32
    x = bits_to_f32(values_bits)
    codes, scales = quantize_rows(x.reshape(1, 32))
    return {
        "name": name,
        "input": [hx(b) for b in values_bits],
        "scale": int(scales[0, 0]),
        "elements": [int(v) for v in codes.reshape(-1).tolist()],
    }


def f32list(vals):
    return [py_f32_bits(v) for v in vals]


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: gen_golden.py OUT.json")
    rng = random.Random(20260801)
    gen = torch.Generator().manual_seed(20260801)

    # E4M3 decode table: all 256 codes through torch's float8 -> float32 conversion.
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    dec = codes.view(FP8).to(F32)
    if CUDA:
        decc = codes.cuda().view(FP8).to(F32).cpu()
        same = (dec == decc) | (torch.isnan(dec) & torch.isnan(decc))
        if not bool(same.all()):
            raise SystemExit("CPU and CUDA fp8 decode disagree")
    decode = [hx(b) for b in f32_bits(dec)]

    # UE8M0 tables: scale 2^(b-127) and reciprocal 2^(127-b); b = 255 is NaN.
    nan_bits = py_f32_bits(float("nan"))
    scale_tab, recip_tab = [], []
    for b in range(256):
        if b == 255:
            scale_tab.append(hx(nan_bits))
            recip_tab.append(hx(nan_bits))
            continue
        s = torch.exp2(torch.tensor(float(b - 127), dtype=torch.float64)).to(F32)
        r = torch.exp2(torch.tensor(float(127 - b), dtype=torch.float64)).to(F32)
        sb, rb = f32_bits(s.reshape(1))[0], f32_bits(r.reshape(1))[0]
        if sb != py_f32_bits(math.ldexp(1.0, b - 127)) or rb != py_f32_bits(math.ldexp(1.0, 127 - b)):
            raise SystemExit("exp2 and ldexp disagree at byte %d" % b)
        scale_tab.append(hx(sb))
        recip_tab.append(hx(rb))

    # Element encode vectors: y -> fp8(clamp(y, -448, 448)).
    enc_in = []
    finite = [float(v) for v in dec.tolist() if not math.isnan(v)]
    pos = sorted(set(v for v in finite if v >= 0))
    enc_in += finite
    for a, b in zip(pos, pos[1:]):
        mid = py_f32_bits((a + b) / 2)  # exact: midpoints of e4m3 values are float32
        for bits in (mid, next_down(mid), next_up(mid)):
            for sign in (0, 1 << 31):
                enc_in.append(struct.unpack("<f", struct.pack("<I", bits | sign))[0])
    enc_in += [448.0, 449.0, 463.99997, 464.0, 464.00003, 479.0, 480.0, 1e6, 3.4028234663852886e38,
               float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -1e-40, 2.0 ** -10, 2.0 ** -11,
               -(2.0 ** -10), 3 * 2.0 ** -10, 5 * 2.0 ** -10, 2.0 ** -6, 2.0 ** -6 * 0.9375]
    for _ in range(400):
        enc_in.append(rng.uniform(-500, 500))
        enc_in.append(math.copysign(math.ldexp(rng.random() + 0.5, rng.randint(-14, 9)), rng.random() - 0.5))
    enc_bits = f32list(enc_in)
    y = bits_to_f32(enc_bits)
    enc_out = cast_fp8(torch.clamp(y, -448.0, 448.0))
    encode = [{"input": hx(b), "code": int(c)} for b, c in zip(enc_bits, enc_out.tolist())]

    # Block cases.
    blocks = []
    blocks.append(block_case("all_zero", [0] * 32))
    blocks.append(block_case("signed_zeros", [0, 1 << 31] * 16))
    blocks.append(block_case("tiny_floor_active", f32list([math.ldexp(rng.uniform(-1, 1), -33 - (i % 12)) for i in range(32)])))
    blocks.append(block_case("float32_subnormals", [1, 0x80000001, 0x007FFFFF, 0x807FFFFF] * 8))
    blocks.append(block_case("normal_randn", f32_bits(torch.randn(32, generator=gen) * 3)))
    blocks.append(block_case("max_448", f32list([448.0, -448.0] + [rng.uniform(-448, 448) for _ in range(30)])))
    blocks.append(block_case("huge_1e30", f32list([1e30] + [rng.uniform(-1, 1) * 1e30 for _ in range(31)])))
    blocks.append(block_case("float32_max", [0x7F7FFFFF, 0xFF7FFFFF] + f32list([rng.uniform(-1, 1) * 3e38 for _ in range(30)])))
    blocks.append(block_case("mixed_sign_wide", f32list([(-1) ** i * math.ldexp(rng.random() + 0.5, rng.randint(-20, 20)) for i in range(32)])))
    ties = [448.0, 1.0625, 1.1875, -1.0625, -1.1875, 2.0 ** -10, 3 * 2.0 ** -10, 5 * 2.0 ** -10, 7 * 2.0 ** -10,
            -3 * 2.0 ** -10, 232.0, 208.0, -232.0, 0.015625 * 1.0625, 17.0, 19.0, 9.5, 10.5, 104.0, 120.0,
            15 * 2.0 ** -10, 13 * 2.0 ** -10, 2.0 ** -6 * 1.0625, 2.0 ** -6 * 1.1875, 272.0, 304.0, 416.0,
            -272.0, 0.0, -0.0, 1.0, -1.0]
    blocks.append(block_case("rne_ties_e0", f32list(ties)))
    blocks.append(block_case("rne_ties_e5", f32list([v * 32 for v in ties])))
    blocks.append(block_case("rne_ties_e_minus_9", f32list([v * 2.0 ** -9 for v in ties])))
    p = py_f32_bits(448.0 * 2.0 ** -3)
    rest = f32list([rng.uniform(-50, 50) for _ in range(31)])
    blocks.append(block_case("amax_exact_pow2_boundary", [p] + rest))
    blocks.append(block_case("amax_just_above_pow2", [next_up(p)] + rest))
    blocks.append(block_case("amax_just_below_pow2", [next_down(p)] + rest))
    blocks.append(block_case("amax_negative", f32list([-448.0 * 4] + [rng.uniform(-100, 100) for _ in range(31)])))
    f = py_f32_bits(448.0 * 2.0 ** -39)
    blocks.append(block_case("floor_boundary_exact", [f] + [0] * 31))
    blocks.append(block_case("floor_boundary_above", [next_up(f)] + [0] * 31))
    blocks.append(block_case("floor_boundary_448e-12", f32list([448e-12, -1e-12, 3e-13] + [0.0] * 29)))
    for i in range(8):
        v = torch.randn(32, generator=gen) * math.ldexp(1.0, rng.randint(-30, 30))
        blocks.append(block_case("random_%d" % i, f32_bits(v)))

    # A whole [1, 128, 128] tensor, quantized along K (normal) and along N (transposed).
    N = K = 128
    mag = torch.exp2(torch.randint(-24, 24, (N, K // 32), generator=gen).to(F32)).repeat_interleave(32, dim=1)
    x = (torch.randn(N, K, generator=gen) * mag).to(F32)
    q, sc = quantize_rows(x)
    xt = x.t().contiguous()
    qt, sct = quantize_rows(xt)
    tensor = {
        "E": 1, "N": N, "K": K,
        "input": [hx(b) for b in f32_bits(x)],
        "elements_hex": bytes(q.reshape(-1).tolist()).hex(),
        "block_scales_hex": bytes(sc.reshape(-1).tolist()).hex(),
        "t_elements_hex": bytes(qt.reshape(-1).tolist()).hex(),
        "t_block_scales_hex": bytes(sct.reshape(-1).tolist()).hex(),
    }

    out = {
        "generator": "kernel/mxfp8/testdata/gen_golden.py",
        "torch_version": torch.__version__,
        "cuda_crosscheck": CUDA,
        "cuda_device": torch.cuda.get_device_name(0) if CUDA else "",
        "rule": "s = max(amax/448, 1e-12) (float32); e = ceil(log2 s) >= -127; byte = e+127; "
                "q = fp8_e4m3fn(clamp(x * 2^-e, -448, 448)) (RNE)",
        "e4m3_decode": decode,
        "ue8m0_scale": scale_tab,
        "ue8m0_reciprocal": recip_tab,
        "encode": encode,
        "blocks": blocks,
        "tensor": tensor,
    }
    with open(sys.argv[1], "w") as fh:
        json.dump(out, fh, indent=1)
    print("wrote %s: %d encode vectors, %d blocks, torch %s, cuda cross-check %s"
          % (sys.argv[1], len(encode), len(blocks), torch.__version__, CUDA))


if __name__ == "__main__":
    main()
