#pragma once
// <immintrin.h> for the AVX-512 kernels. GCC 12's AVX-512 headers initialise "undefined" vectors
// from themselves, which -Wuninitialized flags inside the headers (GCC bug 105593). Clang has
// neither the bug nor GCC's -Wmaybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
