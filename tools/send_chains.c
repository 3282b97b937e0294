// send_chains.c — a test program for the shim's send stacks, run under the
// preload shim by guard/server/shim_output_test.cc (ShimOutput.SendStacks): it
// accepts one connection on 127.0.0.1:PORT and sends the letters of PATTERN
// one byte a write(), each from its own call chain: main -> via_a ->
// through -> send_one -> write for 'a', main -> via_b -> through ->
// send_one -> write for 'b'. via_a and via_b have the same frame, so the
// two chains differ only in the return address two frames above the
// send: a stack cache keyed on the innermost frames alone would mix them
// up. Then it waits for the peer to close.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

__attribute__((noinline)) void send_one(int fd, char c) {
  if (write(fd, &c, 1) != 1) {
    perror("write");
    exit(1);
  }
  __asm__ volatile("" ::: "memory"); /* no tail call: this frame stays */
}

__attribute__((noinline)) void through(int fd, char c) {
  send_one(fd, c);
  __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void via_a(int fd) {
  through(fd, 'a');
  __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void via_b(int fd) {
  through(fd, 'b');
  __asm__ volatile("" ::: "memory");
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: send_chains PORT PATTERN (of a and b)\n");
    return 2;
  }
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
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
  for (const char* p = argv[2]; *p; p++) {
    if (*p == 'a')
      via_a(fd);
    else
      via_b(fd);
  }
  char buf[64];
  while (read(fd, buf, sizeof buf) > 0) {
  }
  return 0;
}
