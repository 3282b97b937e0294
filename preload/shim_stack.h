/* shim_stack.h — the server's stack at a send (shim_stack.c). Above
 * shim_state.h only (README.md, "Layers"). */
#ifndef LOCKSTEP_SHIM_STACK_H
#define LOCKSTEP_SHIM_STACK_H

#include <stdint.h>

#include "preload/shim_state.h"

/* Where a send wrapper was called from: its return address and where that
 * lies (the frame pointer's word above; stack_take checks it). Declared
 * first thing in each wrapper by SEND_SITE. */
struct send_site {
  void* const* ra_slot;
  void* ra;
};
#define SEND_SITE(name)                                                        \
  const struct send_site name = {(void* const*)__builtin_frame_address(0) + 1, \
                                 __builtin_return_address(0)}
struct send_stack {
  uint32_t depth;
  uint64_t chain; /* the cached chain it is (equal ids: equal stacks); 0: walked plainly */
  uintptr_t pc[LS_STACK_DEPTH];
};
/* Sets the walker up: stacks are taken from now on. */
LS_HIDDEN void stack_init(void);
/* The stack of the send whose wrapper was called from site, the shim's
 * frames left out. */
LS_HIDDEN void stack_take(struct send_stack* s, const struct send_site* site);

#endif
