/* Stand-in for the VDPAU header: handles are 32-bit ids; the get-proc-address callback is passed by pointer and
 * declared opaque here. */
#include <stdint.h>
typedef uint32_t VdpDevice;
typedef uint32_t VdpVideoSurface;
typedef uint32_t VdpOutputSurface;
typedef void VdpGetProcAddress;
