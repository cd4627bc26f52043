/* Stand-in for the OpenGL header: only the two types cudaGL.h's prototypes use (gl.h: both are 32-bit unsigned). */
typedef unsigned int GLuint;
typedef unsigned int GLenum;
