#pragma once
// <immintrin.h> for the kernels. GCC 12 reports -W(maybe-)uninitialized inside the intrinsics'
// own inline bodies (the undefined-vector idiom of _mm512_undefined_* and friends) wherever
// they are inlined: not our code, so silenced for that header alone.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
