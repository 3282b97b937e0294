// shim_send_bench.c — a measuring tool for the shim's output side, run under
// the preload shim by guard/server/shim_output_test.cc
// (ShimOutput.SendWithAndWithoutDigests): it
// accepts one connection on 127.0.0.1:PORT (the test's replay connection,
// which the shim tracks) and sends COUNT replies of SIZE bytes with write(),
// one call each, timing every batch of 1000 calls. Prints one line:
//   sends N batch_ns_per_send_median M batch_ns_per_send_min L
// With the shim hashing outputs or not (LOCKSTEP_SHIM_OUTPUT_DIGESTS), the
// difference is what hashing costs per send.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp(const void* a, const void* b) {
  uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: shim_send_bench PORT COUNT SIZE\n");
    return 2;
  }
  int port = atoi(argv[1]), batches = atoi(argv[2]) / 1000, size = atoi(argv[3]);
  if (batches < 1 || size < 1 || size > 65536) return 2;
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(ls, (struct sockaddr*)&a, sizeof a) != 0 || listen(ls, 4) != 0) {
    perror("listen");
    return 1;
  }
  int fd = accept(ls, NULL, NULL);
  if (fd < 0) {
    perror("accept");
    return 1;
  }
  char* buf = malloc((size_t)size);
  memset(buf, '+', (size_t)size);
  uint64_t* per = calloc((size_t)batches, sizeof *per);
  for (int b = 0; b < batches; b++) {
    uint64_t t0 = now_ns();
    for (int i = 0; i < 1000; i++) {
      buf[i % size] ^= 1; /* not the same bytes every time */
      for (ssize_t done = 0; done < size;) {
        ssize_t n = write(fd, buf + done, (size_t)(size - done));
        if (n <= 0) {
          perror("write");
          return 1;
        }
        done += n;
      }
    }
    per[b] = (now_ns() - t0) / 1000;
  }
  qsort(per, (size_t)batches, sizeof *per, cmp);
  printf("sends %d batch_ns_per_send_median %lu batch_ns_per_send_min %lu\n", batches * 1000,
         (unsigned long)per[batches / 2], (unsigned long)per[0]);
  fflush(stdout);
  close(fd);
  return 0;
}
