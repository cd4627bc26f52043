/* Stand-in for cudaProfiler.h (not in the CUDA 13 PyPI wheels): the output-mode enum and the three profiler
 * entry points, as the CUDA 12 header declared them; cudaProfilerTypedefs.h has the same signatures. */
#include <cuda.h>
typedef enum CUoutput_mode_enum { CU_OUT_KEY_VALUE_PAIR = 0x00, CU_OUT_CSV = 0x01 } CUoutput_mode;
CUresult CUDAAPI cuProfilerInitialize(const char *configFile, const char *outputFile, CUoutput_mode outputMode);
CUresult CUDAAPI cuProfilerStart(void);
CUresult CUDAAPI cuProfilerStop(void);
