/* cuda_runtime.h — see cuda_runtime_api.h (slowrank fake CUDA runtime). */
#ifndef SLOWRANK_FAKE_CUDA_RUNTIME_H_
#define SLOWRANK_FAKE_CUDA_RUNTIME_H_

#include "cuda_runtime_api.h"

#endif /* SLOWRANK_FAKE_CUDA_RUNTIME_H_ */
