#include "textflag.h"

// func dotRowsAsm(a, b *float32, n, stride, rows int, sums *float32)
TEXT ·dotRowsAsm(SB), NOSPLIT, $0-48
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DX
	MOVQ n+16(FP), R11
	MOVQ stride+24(FP), R10
	SHLQ $2, R10
	MOVQ rows+32(FP), R9
	MOVQ sums+40(FP), R8

row:
	MOVQ   SI, AX
	MOVQ   DX, DI
	MOVQ   R11, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

rowloop:
	VMOVUPS 0(AX), Y4
	VMOVUPS 32(AX), Y5
	VMOVUPS 64(AX), Y6
	VMOVUPS 96(AX), Y7
	VMULPS  0(DI), Y4, Y4
	VMULPS  32(DI), Y5, Y5
	VMULPS  64(DI), Y6, Y6
	VMULPS  96(DI), Y7, Y7
	VADDPS  Y4, Y0, Y0
	VADDPS  Y5, Y1, Y1
	VADDPS  Y6, Y2, Y2
	VADDPS  Y7, Y3, Y3
	ADDQ    $128, AX
	ADDQ    $128, DI
	SUBQ    $32, CX
	JNZ     rowloop

	// lanes v = (acc0 + acc1) + (acc2 + acc3); then as reduce:
	// h[l] = v[l] + v[l+4], (h0 + h2) + (h1 + h3)
	VADDPS       Y1, Y0, Y0
	VADDPS       Y3, Y2, Y2
	VADDPS       Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS       X1, X0, X0
	VMOVHLPS     X0, X0, X1
	VADDPS       X1, X0, X0
	VMOVSHDUP    X0, X1
	VADDSS       X1, X0, X0
	VMOVSS       X0, (R8)
	ADDQ         $4, R8
	ADDQ         R10, SI
	DECQ         R9
	JNZ          row
	VZEROUPPER
	RET
