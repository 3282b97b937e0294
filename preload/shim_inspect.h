/* shim_inspect.h — connections accepted while this replica does not lead
 * (shim_inspect.c). Above shim_state.h and shim_clock.h (README.md,
 * "Layers"). */
#ifndef LOCKSTEP_SHIM_INSPECT_H
#define LOCKSTEP_SHIM_INSPECT_H

#include <stdint.h>

#include "preload/shim_state.h"

/* 1: fd (accepted from peer_ip, network order, and port; peer: both as
 * text) is an inspection connection, served; 0: refuse it. */
LS_HIDDEN int inspect_admit(int fd, int port, uint32_t peer_ip, const char* peer);
/* 1 when fd is an inspection connection and this replica has led since: its
 * reads must return EOF. */
LS_HIDDEN int inspection_closed(int fd);
LS_HIDDEN void inspect_forget(int fd); /* fd is closed or reused */

#endif
