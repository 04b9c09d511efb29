/*
 * A stand-in for the CUDA runtime header, for compiling tests/c/nccl_port.c
 * where no CUDA toolkit is installed (nothing is linked or run). The stream
 * types are declared exactly as CUDA declares them (driver_types.h and
 * cuda.h): both are `struct CUstream_st *`.
 */
#ifndef SNCL_TEST_CUDA_STUB_H
#define SNCL_TEST_CUDA_STUB_H

#include <stddef.h>

typedef struct CUstream_st *cudaStream_t;
typedef struct CUstream_st *CUstream;

typedef enum cudaError_enum { cudaSuccess = 0 } cudaError_t;

#ifdef __cplusplus
extern "C" {
#endif
cudaError_t cudaSetDevice(int device);
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMemset(void *ptr, int value, size_t size);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
const char *cudaGetErrorString(cudaError_t error);
#ifdef __cplusplus
}
#endif

#endif
