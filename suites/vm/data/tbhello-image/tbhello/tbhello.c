/* A tiny tool for testing the image's source_tools mechanism: it is built inside the image
 * root by ./configure && make && make install, like an autotools release tarball. */
#include <stdio.h>
#include <string.h>

#ifndef TBHELLO_VERSION
#error "configure did not run"
#endif

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "-V") == 0) {
		printf("tbhello version %s\n", TBHELLO_VERSION);
		return 0;
	}
	printf("hello from a source-built tool\n");
	return 0;
}
