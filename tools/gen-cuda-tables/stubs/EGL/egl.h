/* Stand-in for the EGL header: only the types cudaEGL.h's prototypes use (handles are pointers, EGLint is 32-bit). */
#include <stdint.h>
typedef int32_t EGLint;
typedef void *EGLImageKHR;
typedef void *EGLStreamKHR;
typedef void *EGLSyncKHR;
