/* shim_stack.c — the server's stack at each send on a hashed connection:
 * shim_output.c keeps it beside the bytes the send took, and a divergence
 * report names the server's functions that sent the first differing byte
 * (guard/server/symbolize.h). Frames of the shim's own code are left out.
 *
 * The walker is libunwind, which caches what it learnt of each return
 * address: ~0.1-0.3 us a send, where libgcc's unwinder (glibc's
 * backtrace(), the fallback when libunwind.so.8 cannot be loaded) reads the
 * unwind tables anew each time, ~2 us. libunwind is dlopen'ed RTLD_LOCAL,
 * never linked: it exports _Unwind_* and backtrace, which would otherwise
 * take over the server's own C++ exceptions and backtraces.
 *
 * Even the fast walk was the largest part of what hashing costs a send, and
 * a server sends from a handful of call chains (redis: its event loop's
 * writeToClient, nearly always). So each thread keeps the last chains it
 * walked, each with where on the stack every return address of it lies. A
 * send whose wrapper was called from the same address, with that return
 * address at the same place, and whose stack still holds every other kept
 * return address at its kept place, comes from that chain: copied, not
 * walked (tens of ns). Why that check suffices: a frame's canonical frame
 * address is its stack pointer plus an offset that its pc fixes, so the same
 * pc with its return address at the same place puts its caller's return
 * address at the same place too, and so on up the chain; every place read
 * is then inside the live stack. A frame addressed through a frame pointer
 * that is not at a fixed distance from its stack pointer (alloca, stack
 * realignment) breaks the induction: the worst that follows is a stale
 * chain in a report. The walk that fills an entry checks that each place
 * holds the address libunwind read from it, and where libunwind cannot say
 * where a return address lies (not in memory: a register, or signed with a
 * pointer authentication code) the thread's sends from that site are walked
 * every time, as before.
 *
 * Same rules as the rest of the shim: no allocation (the entries are
 * thread-local arrays), errno untouched by the hit path (the walk may set
 * it: out_sent's caller restores it). */
#define _GNU_SOURCE
#include "preload/shim_stack.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <stdatomic.h>
#include <string.h>

#include "preload/shim_state.h"

#define UNW_LOCAL_ONLY
#include <libunwind.h> /* types and names only: the library is dlopen'ed (stack_init) */
#define LS_STR2(x) #x
#define LS_STR(x) LS_STR2(x) /* a libunwind macro's real symbol name */

static int stacks_on;
static uintptr_t shim_text_lo, shim_text_hi;
/* The plain walk: unw_backtrace, or glibc's backtrace. */
static int (*walk)(void**, int);
/* libunwind's cursor, for the walk that fills a cache entry; NULL: no
 * cache (an architecture where unw_getcontext is a macro, a libunwind
 * without them). */
static int (*u_getcontext)(unw_context_t*);
static int (*u_init_local)(unw_cursor_t*, unw_context_t*);
static int (*u_step)(unw_cursor_t*);
static int (*u_get_reg)(unw_cursor_t*, unw_regnum_t, unw_word_t*);
static int (*u_get_save_loc)(unw_cursor_t*, int, unw_save_loc_t*);

/* Thread-local, in the static block: the shim is preloaded, never dlopen'ed
 * (and the general model's __tls_get_addr showed in a send's cost). */
#define LS_TLS __thread __attribute__((tls_model("initial-exec")))

/* A call chain this thread sent from. */
#define LS_CHAINS 4
struct chain {
  uint64_t id;                  /* process-wide, from 1; 0: the entry is empty */
  uint32_t depth;               /* frames kept, <= LS_STACK_DEPTH */
  uintptr_t at[LS_STACK_DEPTH]; /* where pc[i] lies on the stack; at[0]: the site's */
  uintptr_t pc[LS_STACK_DEPTH];
};
static _Atomic(uint64_t) chain_ids;
static LS_TLS struct chain chains[LS_CHAINS];
static LS_TLS uint32_t chain_next;
/* The last site of this thread whose chain could not be kept, and how many
 * could not: past LS_UNKEPT_MAX the thread walks plainly, never in vain. */
#define LS_UNKEPT_MAX 16
static LS_TLS uintptr_t unkept_at, unkept_pc;
static LS_TLS uint32_t unkept;
/* This thread is in stack_take: a signal handler's send walks plainly. */
static LS_TLS int taking;

/* dl_iterate_phdr: the executable segment holding the address `data`. */
static int find_own_text(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size;
  uintptr_t me = (uintptr_t)data;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr)* ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
    if (me >= lo && me < hi) {
      shim_text_lo = lo;
      shim_text_hi = hi;
      return 1;
    }
  }
  return 0;
}

void stack_init(void) {
  stacks_on = 1;
  dl_iterate_phdr(find_own_text, (void*)(uintptr_t)&stack_init);
  void* lib = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
  walk = lib ? (int (*)(void**, int))dlsym(lib, "unw_backtrace") : NULL;
  int (*policy)(unw_addr_space_t, unw_caching_policy_t) =
      lib ? (int (*)(unw_addr_space_t, unw_caching_policy_t))dlsym(lib,
                                                                   LS_STR(unw_set_caching_policy))
          : NULL;
  unw_addr_space_t* space =
      lib ? (unw_addr_space_t*)dlsym(lib, LS_STR(unw_local_addr_space)) : NULL;
  if (!walk || !policy || !space) {
    walk = backtrace;
    shim_log("libunwind.so.8 not usable (%s): send stacks by glibc's backtrace (slower)",
             lib ? "symbols missing" : dlerror());
  } else {
    policy(*space, UNW_CACHE_PER_THREAD);
    u_getcontext = (int (*)(unw_context_t*))dlsym(lib, LS_STR(unw_tdep_getcontext));
    u_init_local = (int (*)(unw_cursor_t*, unw_context_t*))dlsym(lib, LS_STR(unw_init_local));
    u_step = (int (*)(unw_cursor_t*))dlsym(lib, LS_STR(unw_step));
    u_get_reg = (int (*)(unw_cursor_t*, unw_regnum_t, unw_word_t*))dlsym(lib, LS_STR(unw_get_reg));
    u_get_save_loc =
        (int (*)(unw_cursor_t*, int, unw_save_loc_t*))dlsym(lib, LS_STR(unw_get_save_loc));
    if (!u_getcontext || !u_init_local || !u_get_reg || !u_get_save_loc) u_step = NULL;
  }
  void* prime[2];
  (void)walk(prime, 2); /* sets the unwinder up now, not at the first send */
}

/* The plain walk, the shim's frames left out. */
static void walk_plainly(struct send_stack* s) {
  void* pc[LS_STACK_DEPTH + 8];
  int n = walk(pc, (int)(sizeof pc / sizeof pc[0]));
  int skip = 0;
  while (skip < n && (uintptr_t)pc[skip] >= shim_text_lo && (uintptr_t)pc[skip] < shim_text_hi)
    skip++;
  s->depth = 0;
  for (int i = skip; i < n && s->depth < LS_STACK_DEPTH; i++) s->pc[s->depth++] = (uintptr_t)pc[i];
}

/* Walks this thread's stack from here into c: the frames from the one whose
 * return address lies at `at0` up. 0: it cannot be kept (c left empty). */
static int walk_chain(struct chain* c, uintptr_t at0) {
  unw_context_t uc;
  unw_cursor_t cur;
  c->id = 0;
  if (u_getcontext(&uc) != 0 || u_init_local(&cur, &uc) != 0) return 0;
  uint32_t d = 0;
  for (int frames = 0; frames < 64 && d < LS_STACK_DEPTH; frames++) {
    if (u_step(&cur) <= 0) break;
    unw_save_loc_t loc;
    unw_word_t ip;
    memset(&loc, 0, sizeof loc);
    int in_memory = u_get_save_loc(&cur, UNW_REG_IP, &loc) == 0 && loc.type == UNW_SLT_MEMORY;
    if (!d && (!in_memory || loc.u.addr != at0)) continue; /* still the shim's own frames */
    if (!in_memory || u_get_reg(&cur, UNW_REG_IP, &ip) != 0) return 0;
    uintptr_t at = (uintptr_t)loc.u.addr;
    /* Each return address above the last, and where libunwind read it. */
    if ((d && at <= c->at[d - 1]) || *(const uintptr_t*)at != (uintptr_t)ip) return 0;
    c->at[d] = at;
    c->pc[d] = (uintptr_t)ip;
    d++;
  }
  if (!d) return 0;
  c->depth = d;
  c->id = atomic_fetch_add_explicit(&chain_ids, 1, memory_order_relaxed) + 1;
  return 1;
}

void stack_take(struct send_stack* s, const struct send_site* site) {
  s->depth = 0;
  s->chain = 0;
  if (!stacks_on) return;
  uintptr_t at0 = (uintptr_t)site->ra_slot, pc0 = (uintptr_t)site->ra;
  if (!u_step || taking || unkept >= LS_UNKEPT_MAX || !at0 || *(const uintptr_t*)at0 != pc0 ||
      (at0 == unkept_at && pc0 == unkept_pc)) {
    walk_plainly(s);
    return;
  }
  taking = 1;
  const struct chain* hit = NULL;
  for (uint32_t k = 0; k < LS_CHAINS && !hit; k++) {
    const struct chain* c = &chains[k];
    if (!c->id || c->at[0] != at0 || c->pc[0] != pc0) continue;
    uint32_t i = 1;
    while (i < c->depth && *(const uintptr_t*)c->at[i] == c->pc[i]) i++;
    if (i == c->depth) hit = c;
  }
  if (!hit) {
    struct chain* c = &chains[chain_next++ % LS_CHAINS];
    if (walk_chain(c, at0)) {
      hit = c;
    } else {
      unkept_at = at0;
      unkept_pc = pc0;
      unkept++;
    }
  }
  if (hit) {
    memcpy(s->pc, hit->pc, hit->depth * sizeof hit->pc[0]);
    s->depth = hit->depth;
    s->chain = hit->id;
  } else {
    walk_plainly(s);
  }
  taking = 0;
}
