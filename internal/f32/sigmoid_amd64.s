#include "textflag.h"

// Constants for sigmoidAsm, eight copies each (one vector); the float
// constants are the float32 values exp.go names.
// log2e
DATA sigc<>+0(SB)/4, $0x3fb8aa3b
DATA sigc<>+4(SB)/4, $0x3fb8aa3b
DATA sigc<>+8(SB)/4, $0x3fb8aa3b
DATA sigc<>+12(SB)/4, $0x3fb8aa3b
DATA sigc<>+16(SB)/4, $0x3fb8aa3b
DATA sigc<>+20(SB)/4, $0x3fb8aa3b
DATA sigc<>+24(SB)/4, $0x3fb8aa3b
DATA sigc<>+28(SB)/4, $0x3fb8aa3b
// half
DATA sigc<>+32(SB)/4, $0x3f000000
DATA sigc<>+36(SB)/4, $0x3f000000
DATA sigc<>+40(SB)/4, $0x3f000000
DATA sigc<>+44(SB)/4, $0x3f000000
DATA sigc<>+48(SB)/4, $0x3f000000
DATA sigc<>+52(SB)/4, $0x3f000000
DATA sigc<>+56(SB)/4, $0x3f000000
DATA sigc<>+60(SB)/4, $0x3f000000
// ln2hi
DATA sigc<>+64(SB)/4, $0x3f318000
DATA sigc<>+68(SB)/4, $0x3f318000
DATA sigc<>+72(SB)/4, $0x3f318000
DATA sigc<>+76(SB)/4, $0x3f318000
DATA sigc<>+80(SB)/4, $0x3f318000
DATA sigc<>+84(SB)/4, $0x3f318000
DATA sigc<>+88(SB)/4, $0x3f318000
DATA sigc<>+92(SB)/4, $0x3f318000
// ln2lo
DATA sigc<>+96(SB)/4, $0xb95e8083
DATA sigc<>+100(SB)/4, $0xb95e8083
DATA sigc<>+104(SB)/4, $0xb95e8083
DATA sigc<>+108(SB)/4, $0xb95e8083
DATA sigc<>+112(SB)/4, $0xb95e8083
DATA sigc<>+116(SB)/4, $0xb95e8083
DATA sigc<>+120(SB)/4, $0xb95e8083
DATA sigc<>+124(SB)/4, $0xb95e8083
// p0
DATA sigc<>+128(SB)/4, $0x39506967
DATA sigc<>+132(SB)/4, $0x39506967
DATA sigc<>+136(SB)/4, $0x39506967
DATA sigc<>+140(SB)/4, $0x39506967
DATA sigc<>+144(SB)/4, $0x39506967
DATA sigc<>+148(SB)/4, $0x39506967
DATA sigc<>+152(SB)/4, $0x39506967
DATA sigc<>+156(SB)/4, $0x39506967
// p1
DATA sigc<>+160(SB)/4, $0x3ab743ce
DATA sigc<>+164(SB)/4, $0x3ab743ce
DATA sigc<>+168(SB)/4, $0x3ab743ce
DATA sigc<>+172(SB)/4, $0x3ab743ce
DATA sigc<>+176(SB)/4, $0x3ab743ce
DATA sigc<>+180(SB)/4, $0x3ab743ce
DATA sigc<>+184(SB)/4, $0x3ab743ce
DATA sigc<>+188(SB)/4, $0x3ab743ce
// p2
DATA sigc<>+192(SB)/4, $0x3c088908
DATA sigc<>+196(SB)/4, $0x3c088908
DATA sigc<>+200(SB)/4, $0x3c088908
DATA sigc<>+204(SB)/4, $0x3c088908
DATA sigc<>+208(SB)/4, $0x3c088908
DATA sigc<>+212(SB)/4, $0x3c088908
DATA sigc<>+216(SB)/4, $0x3c088908
DATA sigc<>+220(SB)/4, $0x3c088908
// p3
DATA sigc<>+224(SB)/4, $0x3d2aa9c1
DATA sigc<>+228(SB)/4, $0x3d2aa9c1
DATA sigc<>+232(SB)/4, $0x3d2aa9c1
DATA sigc<>+236(SB)/4, $0x3d2aa9c1
DATA sigc<>+240(SB)/4, $0x3d2aa9c1
DATA sigc<>+244(SB)/4, $0x3d2aa9c1
DATA sigc<>+248(SB)/4, $0x3d2aa9c1
DATA sigc<>+252(SB)/4, $0x3d2aa9c1
// p4
DATA sigc<>+256(SB)/4, $0x3e2aaaaa
DATA sigc<>+260(SB)/4, $0x3e2aaaaa
DATA sigc<>+264(SB)/4, $0x3e2aaaaa
DATA sigc<>+268(SB)/4, $0x3e2aaaaa
DATA sigc<>+272(SB)/4, $0x3e2aaaaa
DATA sigc<>+276(SB)/4, $0x3e2aaaaa
DATA sigc<>+280(SB)/4, $0x3e2aaaaa
DATA sigc<>+284(SB)/4, $0x3e2aaaaa
// p5
DATA sigc<>+288(SB)/4, $0x3f000000
DATA sigc<>+292(SB)/4, $0x3f000000
DATA sigc<>+296(SB)/4, $0x3f000000
DATA sigc<>+300(SB)/4, $0x3f000000
DATA sigc<>+304(SB)/4, $0x3f000000
DATA sigc<>+308(SB)/4, $0x3f000000
DATA sigc<>+312(SB)/4, $0x3f000000
DATA sigc<>+316(SB)/4, $0x3f000000
// one
DATA sigc<>+320(SB)/4, $0x3f800000
DATA sigc<>+324(SB)/4, $0x3f800000
DATA sigc<>+328(SB)/4, $0x3f800000
DATA sigc<>+332(SB)/4, $0x3f800000
DATA sigc<>+336(SB)/4, $0x3f800000
DATA sigc<>+340(SB)/4, $0x3f800000
DATA sigc<>+344(SB)/4, $0x3f800000
DATA sigc<>+348(SB)/4, $0x3f800000
// lim
DATA sigc<>+352(SB)/4, $0x42ae0000
DATA sigc<>+356(SB)/4, $0x42ae0000
DATA sigc<>+360(SB)/4, $0x42ae0000
DATA sigc<>+364(SB)/4, $0x42ae0000
DATA sigc<>+368(SB)/4, $0x42ae0000
DATA sigc<>+372(SB)/4, $0x42ae0000
DATA sigc<>+376(SB)/4, $0x42ae0000
DATA sigc<>+380(SB)/4, $0x42ae0000
// abs
DATA sigc<>+384(SB)/4, $0x7fffffff
DATA sigc<>+388(SB)/4, $0x7fffffff
DATA sigc<>+392(SB)/4, $0x7fffffff
DATA sigc<>+396(SB)/4, $0x7fffffff
DATA sigc<>+400(SB)/4, $0x7fffffff
DATA sigc<>+404(SB)/4, $0x7fffffff
DATA sigc<>+408(SB)/4, $0x7fffffff
DATA sigc<>+412(SB)/4, $0x7fffffff
// sign
DATA sigc<>+416(SB)/4, $0x80000000
DATA sigc<>+420(SB)/4, $0x80000000
DATA sigc<>+424(SB)/4, $0x80000000
DATA sigc<>+428(SB)/4, $0x80000000
DATA sigc<>+432(SB)/4, $0x80000000
DATA sigc<>+436(SB)/4, $0x80000000
DATA sigc<>+440(SB)/4, $0x80000000
DATA sigc<>+444(SB)/4, $0x80000000
// bias
DATA sigc<>+448(SB)/4, $0x0000007f
DATA sigc<>+452(SB)/4, $0x0000007f
DATA sigc<>+456(SB)/4, $0x0000007f
DATA sigc<>+460(SB)/4, $0x0000007f
DATA sigc<>+464(SB)/4, $0x0000007f
DATA sigc<>+468(SB)/4, $0x0000007f
DATA sigc<>+472(SB)/4, $0x0000007f
DATA sigc<>+476(SB)/4, $0x0000007f
GLOBL sigc<>(SB), RODATA|NOPTR, $480

// func sigmoidAsm(dst, src *float32, n int) int
//
// Writes dst[i] = Sigmoid(src[i]) eight elements at a time, with exactly
// the float32 operations of Sigmoid and Exp in exp.go (no fused
// multiply-add), while every element of the next eight has |x| <= 87
// (where Exp needs neither its overflow, underflow nor subnormal cases);
// returns how many elements it wrote (a multiple of 8).
TEXT ·sigmoidAsm(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ AX, AX
	VMOVUPS sigc<>+320(SB), Y15
	VXORPS  Y14, Y14, Y14

loop:
	CMPQ CX, $8
	JLT  done
	VMOVUPS   (SI), Y0
	VANDPS    sigc<>+384(SB), Y0, Y1
	VCMPPS    $2, sigc<>+352(SB), Y1, Y2 // |x| <= 87 (false for NaN)
	VMOVMSKPS Y2, DX
	CMPL      DX, $0xff
	JNE       done

	// a = -|x|; e = Exp(a)
	VXORPS     sigc<>+416(SB), Y1, Y1
	VMULPS     sigc<>+0(SB), Y1, Y3
	VADDPS     sigc<>+32(SB), Y3, Y3
	VROUNDPS   $1, Y3, Y3            // n = floor(a*log2e + 0.5)
	VMULPS     sigc<>+64(SB), Y3, Y4
	VSUBPS     Y4, Y1, Y4            // r = a - n*ln2hi
	VMULPS     sigc<>+96(SB), Y3, Y5
	VSUBPS     Y5, Y4, Y4            // r -= n*ln2lo
	VMULPS     sigc<>+128(SB), Y4, Y5
	VADDPS     sigc<>+160(SB), Y5, Y5
	VMULPS     Y4, Y5, Y5
	VADDPS     sigc<>+192(SB), Y5, Y5
	VMULPS     Y4, Y5, Y5
	VADDPS     sigc<>+224(SB), Y5, Y5
	VMULPS     Y4, Y5, Y5
	VADDPS     sigc<>+256(SB), Y5, Y5
	VMULPS     Y4, Y5, Y5
	VADDPS     sigc<>+288(SB), Y5, Y5
	VMULPS     Y4, Y4, Y6            // r*r
	VMULPS     Y6, Y5, Y5            // p*(r*r)
	VADDPS     Y4, Y5, Y5            // + r
	VADDPS     Y15, Y5, Y5           // + 1
	VCVTTPS2DQ Y3, Y6
	VPADDD     sigc<>+448(SB), Y6, Y6
	VPSLLD     $23, Y6, Y6           // 2^n
	VMULPS     Y6, Y5, Y5            // e

	// x >= 0: 1/(1+e); x < 0: e/(1+e)
	VADDPS    Y15, Y5, Y6            // 1 + e
	VCMPPS    $1, Y14, Y0, Y2        // x < 0
	VBLENDVPS Y2, Y5, Y15, Y2        // x < 0 ? e : 1
	VDIVPS    Y6, Y2, Y2
	VMOVUPS   Y2, (DI)

	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	ADDQ $8, AX
	JMP  loop

done:
	VZEROUPPER
	MOVQ AX, ret+24(FP)
	RET

