// execimage: a selected process that execs another image under its PID
// while the agent writes into its control block (agent/procmem_test.go).
// Both images put a control block and a handback block, shaped as the
// injection library's, at the same fixed address: the worst case, in which
// the new image looks like the old one to anything that reads by address.
//
//   execimage          prints "first ADDR", execs itself as "second" when a
//                      line "exec" comes on stdin
//   execimage second   prints "second", then for each line "check" prints
//                      "dirty N": how many bytes of its blocks changed since
//                      it wrote them (nothing but the agent writes there)
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "slowrank_abi.h"

#define BLOCK_ADDR ((void *)0x5a5a0000000UL)
#define BLOCK_SIZE 4096

static unsigned char snap[BLOCK_SIZE];

int main(int argc, char **argv)
{
	unsigned char *p = mmap(BLOCK_ADDR, BLOCK_SIZE, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (p != BLOCK_ADDR) {
		perror("mmap");
		return 1;
	}
	struct slowrank_cupti_control *c = (void *)p;
	struct slowrank_cupti_handback *h = (void *)(p + 1024);
	c->magic = SLOWRANK_CONTROL_MAGIC;
	c->version = SLOWRANK_CONTROL_VERSION;
	c->size = sizeof *c;
	c->handback_addr = (uintptr_t)h;
	h->magic = SLOWRANK_HANDBACK_MAGIC;
	h->version = SLOWRANK_HANDBACK_VERSION;
	h->size = sizeof *h;
	memcpy(snap, p, BLOCK_SIZE);

	char line[64];
	if (argc > 1 && !strcmp(argv[1], "second")) {
		printf("second\n");
		fflush(stdout);
		while (fgets(line, sizeof line, stdin)) {
			int dirty = 0;
			for (int i = 0; i < BLOCK_SIZE; i++)
				dirty += p[i] != snap[i];
			printf("dirty %d\n", dirty);
			fflush(stdout);
		}
		return 0;
	}
	printf("first %p\n", (void *)p);
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		return 0;
	execl("/proc/self/exe", argv[0], "second", (char *)0);
	perror("exec");
	return 1;
}
