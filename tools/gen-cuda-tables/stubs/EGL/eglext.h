/* Stand-in for eglext.h: egl.h above already declares what cudaEGL.h needs. */
