#include "textflag.h"

// func dotRowsAsm(a, b *float32, n, stride, rows int, sums *float32, add bool)
//
// Rows go eight at a time: the pairs of rows (r, r+4), r = 0..3, each run
// the vector loop with four accumulators apiece, sharing the loads of b;
// each pair's lanes are halved once (lane l plus lane l+4) into one
// register, and the four registers are reduced together by shuffles into
// the eight rows' sums, in row order, each computed in the order of one
// row alone. Then each row's tail, one element after another, and the
// sums written (or added) to sums. The rows left over go one at a time.
//
// Registers: SI the group's (or row's) first row, DX b, R11 the bytes of
// the vector part of a row, BX the bytes of its tail, R10 the bytes of a
// row stride, R9 the rows left, R8 where the next sum goes; 0(SP) holds a
// group's eight sums during the tails.
TEXT ·dotRowsAsm(SB), NOSPLIT, $32-49
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DX
	MOVQ n+16(FP), BX
	SHLQ $2, BX
	MOVQ BX, R11
	ANDQ $~127, R11
	SUBQ R11, BX
	MOVQ stride+24(FP), R10
	SHLQ $2, R10
	MOVQ rows+32(FP), R9
	MOVQ sums+40(FP), R8
	CMPQ R9, $8
	JLT  single

group:
	MOVQ SI, DI // row r of the group, r = 0..3
	MOVQ $4, R12

pair:
	LEAQ   (DI)(R10*4), AX // row r+4
	MOVQ   DX, R13
	MOVQ   R11, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

pairloop:
	VMOVUPS 0(R13), Y8
	VMULPS  0(DI), Y8, Y9
	VMULPS  0(AX), Y8, Y10
	VADDPS  Y9, Y0, Y0
	VADDPS  Y10, Y4, Y4
	VMOVUPS 32(R13), Y8
	VMULPS  32(DI), Y8, Y9
	VMULPS  32(AX), Y8, Y10
	VADDPS  Y9, Y1, Y1
	VADDPS  Y10, Y5, Y5
	VMOVUPS 64(R13), Y8
	VMULPS  64(DI), Y8, Y9
	VMULPS  64(AX), Y8, Y10
	VADDPS  Y9, Y2, Y2
	VADDPS  Y10, Y6, Y6
	VMOVUPS 96(R13), Y8
	VMULPS  96(DI), Y8, Y9
	VMULPS  96(AX), Y8, Y10
	VADDPS  Y9, Y3, Y3
	VADDPS  Y10, Y7, Y7
	ADDQ    $128, R13
	ADDQ    $128, DI
	ADDQ    $128, AX
	SUBQ    $128, CX
	JNZ     pairloop

	// Each row's lanes (acc0 + acc1) + (acc2 + acc3); then lane l plus
	// lane l+4, of row r in the low half, of row r+4 in the high half.
	VADDPS     Y1, Y0, Y0
	VADDPS     Y3, Y2, Y2
	VADDPS     Y2, Y0, Y0
	VADDPS     Y5, Y4, Y4
	VADDPS     Y7, Y6, Y6
	VADDPS     Y6, Y4, Y4
	VPERM2F128 $0x20, Y4, Y0, Y1
	VPERM2F128 $0x31, Y4, Y0, Y2
	VADDPS     Y2, Y1, Y1

	// After the four pairs, Y12..Y15 hold pairs 0..3.
	VMOVAPS Y13, Y12
	VMOVAPS Y14, Y13
	VMOVAPS Y15, Y14
	VMOVAPS Y1, Y15
	SUBQ    R11, DI          // back to the row's start, then the next row
	ADDQ    R10, DI
	DECQ    R12
	JNZ     pair

	// Per 128-bit half, [h0 h1 h2 h3] of one row: (h0 + h2), (h1 + h3) of
	// pairs 0 and 1, then of 2 and 3, then the two added: the sums of rows
	// 0..3 in the low half, 4..7 in the high.
	VSHUFPS $0x44, Y13, Y12, Y0
	VSHUFPS $0xEE, Y13, Y12, Y1
	VADDPS  Y1, Y0, Y0
	VSHUFPS $0x44, Y15, Y14, Y2
	VSHUFPS $0xEE, Y15, Y14, Y3
	VADDPS  Y3, Y2, Y2
	VSHUFPS $0x88, Y2, Y0, Y1
	VSHUFPS $0xDD, Y2, Y0, Y3
	VADDPS  Y3, Y1, Y1
	TESTQ   BX, BX
	JNZ     tails8
	CMPB    add+48(FP), $0
	JEQ     store8
	VMOVUPS (R8), Y2
	VADDPS  Y1, Y2, Y1

store8:
	VMOVUPS Y1, (R8)
	ADDQ    $32, R8
	JMP     next8

tails8:
	VMOVUPS Y1, 0(SP)
	LEAQ    (SI)(R11*1), DI // row r's tail
	LEAQ    (DX)(R11*1), AX // b's tail
	XORQ    R12, R12

tailrow:
	VMOVSS 0(SP)(R12*4), X0
	XORQ   CX, CX

tailel:
	VMOVSS (DI)(CX*1), X2
	VMULSS (AX)(CX*1), X2, X2
	VADDSS X2, X0, X0
	ADDQ   $4, CX
	CMPQ   CX, BX
	JNE    tailel
	CMPB   add+48(FP), $0
	JEQ    tailstore
	VMOVSS (R8), X1
	VADDSS X0, X1, X0

tailstore:
	VMOVSS X0, (R8)
	ADDQ   $4, R8
	ADDQ   R10, DI
	INCQ   R12
	CMPQ   R12, $8
	JNE    tailrow

next8:
	LEAQ (SI)(R10*8), SI
	SUBQ $8, R9
	CMPQ R9, $8
	JGE  group

single:
	TESTQ R9, R9
	JZ    done

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
	SUBQ    $128, CX
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

	// The tail: AX and DI are already there.
	XORQ CX, CX
	CMPQ CX, BX
	JEQ  rowdone

rowtail:
	VMOVSS (AX)(CX*1), X2
	VMULSS (DI)(CX*1), X2, X2
	VADDSS X2, X0, X0
	ADDQ   $4, CX
	CMPQ   CX, BX
	JNE    rowtail

rowdone:
	CMPB   add+48(FP), $0
	JEQ    store1
	VMOVSS (R8), X1
	VADDSS X0, X1, X0

store1:
	VMOVSS X0, (R8)
	ADDQ   $4, R8
	ADDQ   R10, SI
	DECQ   R9
	JNZ    row

done:
	VZEROUPPER
	RET
