#include "textflag.h"

// exp32's constants (fastexp.go), as float32 bits.
DATA expc<>+0(SB)/4, $0x3fb8aa3b  // log2 e
DATA expc<>+4(SB)/4, $0x3f318000  // ln 2, high part
DATA expc<>+8(SB)/4, $0xb95e8083  // ln 2, low part
DATA expc<>+12(SB)/4, $0xc2aeac4f // lowest x
DATA expc<>+16(SB)/4, $0x42b0c0a5 // highest x
DATA expc<>+20(SB)/4, $0x3ab60b61 // 1/720
DATA expc<>+24(SB)/4, $0x3c088889 // 1/120
DATA expc<>+28(SB)/4, $0x3d2aaaab // 1/24
DATA expc<>+32(SB)/4, $0x3e2aaaab // 1/6
DATA expc<>+36(SB)/4, $0x3f000000 // 1/2
DATA expc<>+40(SB)/4, $0x3f800000 // 1
DATA expc<>+44(SB)/4, $0x0000007f // the exponent's bias, 127
DATA expc<>+48(SB)/4, $0x39500d01 // 1/5040
GLOBL expc<>(SB), RODATA|NOPTR, $52

// EXP8 sets Y0 to exp32 of Y0's eight lanes, in exp32's operations and
// order; it uses Y1-Y3 and reads the constants from Y10-Y14.
#define EXP8 \
	VMAXPS Y0, Y13, Y0 \
	VMINPS Y0, Y12, Y0 \
	VMULPS Y14, Y0, Y1 \
	VROUNDPS $0, Y1, Y1 \
	VMULPS Y11, Y1, Y2 \
	VSUBPS Y2, Y0, Y0 \
	VMULPS Y10, Y1, Y2 \
	VSUBPS Y2, Y0, Y0 \
	VBROADCASTSS expc<>+48(SB), Y2 \
	VMULPS Y0, Y2, Y2 \
	VBROADCASTSS expc<>+20(SB), Y3 \
	VADDPS Y3, Y2, Y2 \
	VMULPS Y0, Y2, Y2 \
	VBROADCASTSS expc<>+24(SB), Y3 \
	VADDPS Y3, Y2, Y2 \
	VMULPS Y0, Y2, Y2 \
	VBROADCASTSS expc<>+28(SB), Y3 \
	VADDPS Y3, Y2, Y2 \
	VMULPS Y0, Y2, Y2 \
	VBROADCASTSS expc<>+32(SB), Y3 \
	VADDPS Y3, Y2, Y2 \
	VMULPS Y0, Y2, Y2 \
	VBROADCASTSS expc<>+36(SB), Y3 \
	VADDPS Y3, Y2, Y2 \
	VMULPS Y0, Y2, Y2 \
	VBROADCASTSS expc<>+40(SB), Y3 \
	VADDPS Y3, Y2, Y2 \
	VMULPS Y0, Y2, Y2 \
	VADDPS Y3, Y2, Y2 \
	VCVTPS2DQ Y1, Y1 \
	VPBROADCASTD expc<>+44(SB), Y3 \
	VPADDD Y3, Y1, Y1 \
	VPSLLD $23, Y1, Y1 \
	VMULPS Y1, Y2, Y0

#define LOADC \
	VBROADCASTSS expc<>+0(SB), Y14 \
	VBROADCASTSS expc<>+4(SB), Y11 \
	VBROADCASTSS expc<>+8(SB), Y10 \
	VBROADCASTSS expc<>+12(SB), Y13 \
	VBROADCASTSS expc<>+16(SB), Y12

// func expSubSum8(x []float32, sub float32) float64
TEXT ·expSubSum8(SB), NOSPLIT, $0-40
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	VBROADCASTSS sub+24(FP), Y15
	LOADC
	VXORPD Y8, Y8, Y8 // sums of lanes 0-3
	VXORPD Y9, Y9, Y9 // sums of lanes 4-7
	SHRQ $3, CX
	JZ sumdone
sumloop:
	VMOVUPS (SI), Y0
	VSUBPS Y15, Y0, Y0
	EXP8
	VCVTPS2PD X0, Y4
	VEXTRACTF128 $1, Y0, X5
	VCVTPS2PD X5, Y5
	VADDPD Y4, Y8, Y8
	VADDPD Y5, Y9, Y9
	ADDQ $32, SI
	DECQ CX
	JNZ sumloop
sumdone:
	VADDPD Y9, Y8, Y8      // s0+s4, s1+s5, s2+s6, s3+s7
	VEXTRACTF128 $1, Y8, X9
	VADDPD X9, X8, X8      // (s0+s4)+(s2+s6), (s1+s5)+(s3+s7)
	VHADDPD X8, X8, X8
	VZEROUPPER
	MOVSD X8, ret+32(FP)
	RET

// func expSubScale8(dst, x []float32, sub float32, k, spread float64)
TEXT ·expSubScale8(SB), NOSPLIT, $0-72
	MOVQ dst_base+0(FP), DI
	MOVQ x_base+24(FP), SI
	MOVQ x_len+32(FP), CX
	VBROADCASTSS sub+48(FP), Y15
	VBROADCASTSD k+56(FP), Y9
	VBROADCASTSD spread+64(FP), Y8
	LOADC
	SHRQ $3, CX
	JZ scaledone
scaleloop:
	VMOVUPS (SI), Y0
	VSUBPS Y15, Y0, Y0
	EXP8
	VCVTPS2PD X0, Y4
	VEXTRACTF128 $1, Y0, X5
	VCVTPS2PD X5, Y5
	VMULPD Y9, Y4, Y4
	VSUBPD Y8, Y4, Y4
	VMULPD Y9, Y5, Y5
	VSUBPD Y8, Y5, Y5
	VCVTPD2PSY Y4, X4
	VCVTPD2PSY Y5, X5
	VINSERTF128 $1, X5, Y4, Y4
	VMOVUPS Y4, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNZ scaleloop
scaledone:
	VZEROUPPER
	RET
