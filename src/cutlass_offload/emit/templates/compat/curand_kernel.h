// cutlass_offload stand-in: kernel_forward.h includes cuRAND only for dropout (HAS_PYTORCH).
#pragma once
