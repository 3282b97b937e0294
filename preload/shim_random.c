/* shim_random.c — the same randomness on every replica ("prevent what can be
 * prevented", issue 8 part 5).
 *
 * Each replica's server would otherwise draw its own random numbers: redis's
 * SPOP, SRANDMEMBER and RANDOMKEY then pick different members on each
 * replica, and their data diverge. When the daemon passes
 * LOCKSTEP_SHIM_RANDOM_SEED (64 hex digits, the same on every replica: the
 * app profile's `same_random`, guard/common/config.h) to the process it started
 * (LOCKSTEP_SHIM_PID), every source of randomness the server reaches through
 * libc gives the same values on every replica. Without the variable (or in
 * any other process: an exec'd child) nothing here changes anything.
 *
 * What we chose, and why:
 *
 *  - Entropy (getrandom, getentropy, arc4random*, and reads of an fd or FILE
 *    opened on /dev/urandom or /dev/random) comes from a deterministic
 *    stream: the ChaCha20 keystream under the seed (a good PRNG, random
 *    access, no state but a byte offset). Each source is a stream of bytes
 *    by offset, so its bytes do not depend on how the server chunks its
 *    reads. getrandom/getentropy/arc4random share one stream; every open of
 *    a random device gets a stream of its own (the n-th open of the process
 *    the n-th stream), so one consumer's reads never shift another's. The
 *    real call still runs first (it checks flags and buffers, and gives the
 *    real errors and short counts): the shim overwrites the bytes the kernel
 *    produced. A FILE opened with fopen is a fopencookie stream that serves
 *    the deterministic bytes itself (fread does not go through read()).
 *
 *  - OpenSSL: RAND_bytes and RAND_priv_bytes, called through the PLT
 *    (mariadbd's my_random_bytes, which makes the 32-byte nonce of an
 *    ed25519 login: apps/mariadb.toml), run the real call, then overwrite
 *    its bytes with a stream of their own (not the entropy stream: OpenSSL
 *    seeds itself with getentropy whenever it decides to, which must not
 *    shift them), keeping its return value (1: success). Defined here
 *    without OpenSSL's headers or library (the shim links nothing that could
 *    clash with the server's own). When no libcrypto is found behind them
 *    (one loaded RTLD_LOCAL by a plugin) they serve getrandom's bytes, or
 *    with same_random the stream's. Only callers of RAND_bytes and
 *    RAND_priv_bytes themselves are reached (also libcrypto's own, through
 *    its PLT); OpenSSL's callers of RAND_bytes_ex and RAND_priv_bytes_ex
 *    (libssl's TLS randoms, most of libcrypto) and its generators' internal
 *    state are not: they stay random. The stream is taken in the order the
 *    threads call: with serial_inputs, the log's order, unless a thread that
 *    holds an input sleeps before its call long enough to be found asleep
 *    (shim_serial.c lets the next input in) and the next one's call comes
 *    first. OpenSSL's first call (providers loaded, generators seeded) slept
 *    that long: it is made when the server first listens, before any input
 *    (mariadbd, 32 concurrent ed25519 logins under load: a login refused on
 *    a replica in 1 run of 25 without it, in none of 55 with it).
 *
 *  - The libc generators keep their own state; the shim makes their SEEDS
 *    identical: srand, srandom, initstate, srand48, seed48, lcong48 (its
 *    seed part) and their _r forms ignore their argument and take instead
 *    the k-th value of a seed stream (k: seeding calls so far). Servers seed
 *    from the clock and the pid (redis: time(NULL) ^ getpid() ^ tv_usec), so
 *    the argument cannot be kept; a generator never seeded is deterministic
 *    already (glibc's fixed default seeds). Replacing the generators instead
 *    would reimplement glibc's sequences for no gain: with identical seeds
 *    and identical calls they are identical. The price: a server reseeding
 *    with a constant to replay a sequence gets another sequence (the same
 *    on every replica). rand_r, erand48, nrand48 and jrand48 keep their
 *    state in the caller's variable: they are left alone (deterministic when
 *    the caller's seed came from a deterministic source such as the above).
 *
 *  - Generators inside the server's own code, seeded from the clock, are
 *    out of libc's reach. The known ones are reseeded from the seed stream
 *    when the server first calls listen() (its own seeding is done by then,
 *    and no client was served yet): redis's MT19937-64, init_genrand64(time
 *    ^ pid), which picks the members of SPOP, SRANDMEMBER and RANDOMKEY on
 *    hash tables. The shim calls it only when the program exports both
 *    init_genrand64 and genrand64_int64 (redis links with -rdynamic); the
 *    reference implementation's signature is void(unsigned long long).
 *
 * All of this state lives in the server's memory: a CRIU checkpoint carries
 * it, and a restored server continues the same sequences.
 *
 * Not covered (stays as random as before): RDRAND/RDSEED instructions
 * (libstdc++'s std::random_device by default), direct syscalls
 * (syscall(SYS_getrandom), Go), libc's own internal calls, generators that
 * mix the clock, the pid or a thread id in themselves (OpenSSL's DRBG
 * nonce), an fd duplicated from a tracked one (dup, dup2, F_DUPFD) or put
 * under a FILE with fdopen (fread reads it with libc's internal read), a
 * device reached by another path than /dev/urandom or /dev/random (a
 * symlink, /proc/self/fd/N) or opened before the shim's constructor ran or
 * at an fd number of LS_MAX_FD or more, fileno() of a fopen'ed random
 * device (-1: it has no fd), entropy consumed at times that differ between
 * replicas (a timer), and the clock and the pid themselves as sources of
 * randomness. Reads from several threads take their bytes in whatever
 * order the threads run.
 *
 * Hot path: read, readv and close test one byte per fd (rnd_fd_slot); only
 * a tracked fd costs more (an fstat per read, to notice an fd number reused
 * behind our back). No allocation except fopencookie in fopen. errno is
 * preserved on every path (the real calls set it as they would).
 */
#define _GNU_SOURCE
#include "preload/shim_random.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include "preload/shim_order.h"
#include "preload/shim_state.h"

extern void __chk_fail(void) __attribute__((noreturn)); /* glibc: a fortify check failed */

/* ------------------------------------------------------------ real calls */

static int (*real_open)(const char*, int, ...);
static int (*real_open64)(const char*, int, ...);
static int (*real_openat)(int, const char*, int, ...);
static int (*real_openat64)(int, const char*, int, ...);
static int (*real___open_2)(const char*, int);
static int (*real___open64_2)(const char*, int);
static int (*real___openat_2)(int, const char*, int);
static int (*real___openat64_2)(int, const char*, int);
static FILE* (*real_fopen)(const char*, const char*);
static FILE* (*real_fopen64)(const char*, const char*);
static ssize_t (*real_read)(int, void*, size_t);
static ssize_t (*real_readv)(int, const struct iovec*, int);
static ssize_t (*real_pread)(int, void*, size_t, off_t);
static ssize_t (*real_pread64)(int, void*, size_t, off64_t);
static ssize_t (*real___read_chk)(int, void*, size_t, size_t);
static ssize_t (*real_getrandom)(void*, size_t, unsigned int);
static int (*real_getentropy)(void*, size_t);
static uint32_t (*real_arc4random)(void);
static void (*real_arc4random_buf)(void*, size_t);
static uint32_t (*real_arc4random_uniform)(uint32_t);
static int (*real_listen)(int, int);
static int (*real_RAND_bytes)(unsigned char*, int);
static int (*real_RAND_priv_bytes)(unsigned char*, int);
static void (*real_srand)(unsigned int);
static void (*real_srandom)(unsigned int);
static char* (*real_initstate)(unsigned int, char*, size_t);
static void (*real_srand48)(long);
static unsigned short* (*real_seed48)(unsigned short[3]);
static void (*real_lcong48)(unsigned short[7]);
static int (*real_srandom_r)(unsigned int, struct random_data*);
static int (*real_initstate_r)(unsigned int, char*, size_t, struct random_data*);
static int (*real_srand48_r)(long, struct drand48_data*);
static int (*real_seed48_r)(unsigned short[3], struct drand48_data*);
static int (*real_lcong48_r)(unsigned short[7], struct drand48_data*);

/* These may run before our constructor (another library's constructor):
 * each looks its real call up itself when it has not been yet (LS_REAL). */

/* ------------------------------------------------------------ state */

/* Streams: the nonce of a ChaCha20 keystream is (domain << 56) | index. */
#define RND_DOM_ENTROPY 1ull /* getrandom, getentropy, arc4random*: index 0 */
#define RND_DOM_DEVICE 2ull  /* the n-th open of a random device: index n (0: shared) */
#define RND_DOM_SEEDS 3ull   /* seeds of the libc generators, 8 bytes each */
#define RND_DOM_APP 4ull     /* reseeds of generators in the server's own code */
#define RND_DOM_OPENSSL 5ull /* RAND_bytes, RAND_priv_bytes: index 0 */
#define RND_NONCE(dom, index) (((dom) << 56) | (index))

/* A stream of an open random device. Slot 0 is shared by whatever finds
 * the table full (still deterministic while the calls are). */
#define RND_SLOTS 64
struct rnd_slot {
  _Atomic(uint32_t) used;
  _Atomic(uint64_t) nonce;
  _Atomic(uint64_t) off; /* bytes of the stream served so far */
};

static int rnd_on;
static uint32_t rnd_key[8];
static _Atomic(uint64_t) rnd_entropy_off; /* bytes of the entropy stream served */
static _Atomic(uint64_t) rnd_openssl_off; /* bytes of the OpenSSL stream served */
static _Atomic(uint64_t) rnd_seeds;       /* seeding calls so far */
static _Atomic(uint64_t) rnd_opens;       /* random devices opened so far */
static _Atomic(int) rnd_app_reseeded;
static struct rnd_slot rnd_slots[RND_SLOTS];
_Atomic(uint8_t) rnd_fd_slot[LS_MAX_FD]; /* shim_internal.h: slot + 1; 0: not tracked */

/* ------------------------------------------------------------ ChaCha20 */

/* The ChaCha20 block function (D. J. Bernstein; RFC 8439, section 2.3),
 * with a 64-bit block counter in words 12-13 and a 64-bit nonce in words
 * 14-15, as in the original design. */
#define RND_ROTL(v, n) (((v) << (n)) | ((v) >> (32 - (n))))
#define RND_QR(a, b, c, d) \
  do {                     \
    a += b;                \
    d ^= a;                \
    d = RND_ROTL(d, 16);   \
    c += d;                \
    b ^= c;                \
    b = RND_ROTL(b, 12);   \
    a += b;                \
    d ^= a;                \
    d = RND_ROTL(d, 8);    \
    c += d;                \
    b ^= c;                \
    b = RND_ROTL(b, 7);    \
  } while (0)

static void chacha_block(uint64_t nonce, uint64_t counter, uint8_t out[64]) {
  uint32_t in[16] = {0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u};
  for (int i = 0; i < 8; i++) in[4 + i] = rnd_key[i];
  in[12] = (uint32_t)counter;
  in[13] = (uint32_t)(counter >> 32);
  in[14] = (uint32_t)nonce;
  in[15] = (uint32_t)(nonce >> 32);
  uint32_t x[16];
  memcpy(x, in, sizeof x);
  for (int i = 0; i < 10; i++) {
    RND_QR(x[0], x[4], x[8], x[12]);
    RND_QR(x[1], x[5], x[9], x[13]);
    RND_QR(x[2], x[6], x[10], x[14]);
    RND_QR(x[3], x[7], x[11], x[15]);
    RND_QR(x[0], x[5], x[10], x[15]);
    RND_QR(x[1], x[6], x[11], x[12]);
    RND_QR(x[2], x[7], x[8], x[13]);
    RND_QR(x[3], x[4], x[9], x[14]);
  }
  for (int i = 0; i < 16; i++) {
    uint32_t v = x[i] + in[i];
    out[4 * i] = (uint8_t)v;
    out[4 * i + 1] = (uint8_t)(v >> 8);
    out[4 * i + 2] = (uint8_t)(v >> 16);
    out[4 * i + 3] = (uint8_t)(v >> 24);
  }
}

/* Bytes [off, off + n) of the stream `nonce`. */
static void stream_fill(uint64_t nonce, uint64_t off, uint8_t* dst, size_t n) {
  uint8_t block[64];
  while (n > 0) {
    chacha_block(nonce, off / 64, block);
    size_t at = (size_t)(off % 64);
    size_t k = 64 - at < n ? 64 - at : n;
    memcpy(dst, block + at, k);
    dst += k;
    off += k;
    n -= k;
  }
}

/* The first n bytes spread over iov, from stream offset off. */
static void stream_fill_iov(uint64_t nonce, uint64_t off, const struct iovec* iov, int iovcnt,
                            size_t n) {
  for (int i = 0; i < iovcnt && n > 0; i++) {
    size_t k = iov[i].iov_len < n ? iov[i].iov_len : n;
    stream_fill(nonce, off, iov[i].iov_base, k);
    off += k;
    n -= k;
  }
}

/* The next n bytes of the entropy stream. */
static void entropy_fill(void* dst, size_t n) {
  uint64_t off = atomic_fetch_add(&rnd_entropy_off, (uint64_t)n);
  stream_fill(RND_NONCE(RND_DOM_ENTROPY, 0), off, dst, n);
}

/* The seed that replaces the argument of the next seeding call. */
static uint64_t next_seed(void) {
  uint64_t k = atomic_fetch_add(&rnd_seeds, 1);
  uint8_t b[8];
  stream_fill(RND_NONCE(RND_DOM_SEEDS, 0), k * 8, b, 8);
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
  return v;
}

/* ------------------------------------------------------------ set-up */

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* 64 hex digits: the 32 bytes of the key, words little-endian. */
static int parse_key(const char* v) {
  uint8_t b[32];
  for (int i = 0; i < 32; i++) {
    int hi = hex_digit(v[2 * i]), lo = hi < 0 ? -1 : hex_digit(v[2 * i + 1]);
    if (hi < 0 || lo < 0) return 0;
    b[i] = (uint8_t)(hi << 4 | lo);
  }
  if (v[64] != 0) return 0;
  for (int i = 0; i < 8; i++)
    rnd_key[i] = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 | (uint32_t)b[4 * i + 2] << 16 |
                 (uint32_t)b[4 * i + 3] << 24;
  return 1;
}

__attribute__((constructor)) static void rnd_init(void) {
  int saved = errno;
  LS_REAL(read);
  LS_REAL(readv);
  LS_REAL(open);
  LS_REAL(fopen);
  LS_REAL(getrandom);
  LS_REAL(listen);
  const char* seed = getenv("LOCKSTEP_SHIM_RANDOM_SEED");
  const char* pid = getenv("LOCKSTEP_SHIM_PID");
  /* Only the process the daemon started (see shim.c): an exec'd child
   * inherits the environment but is not the server. */
  if (seed && *seed && pid && atoi(pid) == (int)getpid()) {
    if (parse_key(seed)) {
      atomic_store(&rnd_slots[0].used, 1);
      atomic_store(&rnd_slots[0].nonce, RND_NONCE(RND_DOM_DEVICE, 0));
      rnd_on = 1;
    } else {
      shim_log(
          "LOCKSTEP_SHIM_RANDOM_SEED is not 64 hex digits: this server's randomness is NOT "
          "made the same as the other replicas'");
    }
  }
  errno = saved;
}

/* ------------------------------------------------------------ random devices */

static int is_random_path(const char* path) {
  return path && (strcmp(path, "/dev/urandom") == 0 || strcmp(path, "/dev/random") == 0);
}

/* fd is /dev/urandom or /dev/random (character device 1:9 or 1:8). */
static int is_random_device(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 &&
         (minor(st.st_rdev) == 8 || minor(st.st_rdev) == 9);
}

/* A stream for a new open of a random device: a free slot, else slot 0. */
static uint32_t slot_take(void) {
  uint64_t n = atomic_fetch_add(&rnd_opens, 1) + 1;
  for (uint32_t s = 1; s < RND_SLOTS; s++) {
    uint32_t free_ = 0;
    if (atomic_compare_exchange_strong(&rnd_slots[s].used, &free_, 1)) {
      atomic_store(&rnd_slots[s].nonce, RND_NONCE(RND_DOM_DEVICE, n));
      atomic_store(&rnd_slots[s].off, 0);
      return s;
    }
  }
  return 0;
}

static void slot_give_back(uint32_t s) {
  if (s > 0 && s < RND_SLOTS) atomic_store(&rnd_slots[s].used, 0);
}

/* The next n bytes of slot s's stream. */
static void slot_fill_iov(uint32_t s, const struct iovec* iov, int iovcnt, size_t n) {
  uint64_t off = atomic_fetch_add(&rnd_slots[s].off, (uint64_t)n);
  stream_fill_iov(atomic_load(&rnd_slots[s].nonce), off, iov, iovcnt, n);
}

/* After a successful open of path (flags): track fd if it is a random
 * device opened for reading. */
static void after_open(int fd, const char* path, int flags) {
  if (!rnd_on || fd < 0 || fd >= LS_MAX_FD || !is_random_path(path)) return;
  if ((flags & O_ACCMODE) == O_WRONLY) return;
  int saved = errno;
  if (is_random_device(fd)) {
    uint32_t s = slot_take();
    uint8_t old = atomic_exchange(&rnd_fd_slot[fd], (uint8_t)(s + 1));
    if (old) slot_give_back(old - 1u); /* a stale entry (the fd was closed unseen) */
  }
  errno = saved;
}

void rnd_forget_slow(int fd) { /* shim_internal.h */
  uint8_t s = atomic_exchange(&rnd_fd_slot[fd], 0);
  if (s) slot_give_back(s - 1u);
}

/* Reads of a tracked fd: the real read, then its bytes replaced by the
 * fd's stream. An fd that is no longer a random device (its number was
 * reused after a close we did not see: dup2, close_range) is forgotten. */
static ssize_t tracked_read(int fd, const struct iovec* iov, int iovcnt, int how, off64_t at) {
  uint8_t s = atomic_load(&rnd_fd_slot[fd]);
  int saved = errno;
  int still = s && is_random_device(fd);
  errno = saved;
  if (!still) rnd_forget_slow(fd);
  ssize_t n;
  switch (how) {
    case 0: n = real_read(fd, iov[0].iov_base, iov[0].iov_len); break;
    case 1: n = real_readv(fd, iov, iovcnt); break;
    default:
      LS_REAL(pread64);
      n = real_pread64(fd, iov[0].iov_base, iov[0].iov_len, at);
      break;
  }
  if (still && n > 0) slot_fill_iov(s - 1u, iov, iovcnt, (size_t)n);
  return n;
}

ssize_t rnd_readv(int fd, const struct iovec* iov, int iovcnt) { /* shim_internal.h */
  LS_REAL(read);
  LS_REAL(readv);
  return tracked_read(fd, iov, iovcnt, iovcnt == 1 ? 0 : 1, 0);
}

ssize_t pread(int fd, void* buf, size_t len, off_t at) {
  if (rnd_tracked(fd)) {
    struct iovec v = {buf, len};
    return tracked_read(fd, &v, 1, 2, at);
  }
  LS_REAL(pread);
  return real_pread(fd, buf, len, at);
}

ssize_t pread64(int fd, void* buf, size_t len, off64_t at) {
  if (rnd_tracked(fd)) {
    struct iovec v = {buf, len};
    return tracked_read(fd, &v, 1, 2, at);
  }
  LS_REAL(pread64);
  return real_pread64(fd, buf, len, at);
}

/* read() of a fortified program (_FORTIFY_SOURCE) when the buffer's size is
 * known: glibc's own goes straight to the system call. */
ssize_t __read_chk(int fd, void* buf, size_t len, size_t buflen) {
  if (rnd_tracked(fd)) {
    if (len > buflen) __chk_fail();
    struct iovec v = {buf, len};
    return rnd_readv(fd, &v, 1);
  }
  LS_REAL(__read_chk);
  return real___read_chk(fd, buf, len, buflen);
}

/* open and its variants: the mode argument is there only with O_CREAT or
 * O_TMPFILE. */
#define RND_NEEDS_MODE(flags) (((flags)&O_CREAT) || ((flags)&O_TMPFILE) == O_TMPFILE)
#define RND_MODE_ARG(flags, mode)      \
  do {                                 \
    if (RND_NEEDS_MODE(flags)) {       \
      va_list ap;                      \
      va_start(ap, flags);             \
      mode = va_arg(ap, unsigned int); \
      va_end(ap);                      \
    }                                  \
  } while (0)

int open(const char* path, int flags, ...) {
  unsigned int mode = 0;
  RND_MODE_ARG(flags, mode);
  LS_REAL(open);
  int fd = real_open(path, flags, mode);
  after_open(fd, path, flags);
  return fd;
}

int open64(const char* path, int flags, ...) {
  unsigned int mode = 0;
  RND_MODE_ARG(flags, mode);
  LS_REAL(open64);
  int fd = real_open64(path, flags, mode);
  after_open(fd, path, flags);
  return fd;
}

int openat(int dirfd, const char* path, int flags, ...) {
  unsigned int mode = 0;
  RND_MODE_ARG(flags, mode);
  LS_REAL(openat);
  int fd = real_openat(dirfd, path, flags, mode);
  after_open(fd, path, flags); /* absolute paths only: a relative one never matches */
  return fd;
}

int openat64(int dirfd, const char* path, int flags, ...) {
  unsigned int mode = 0;
  RND_MODE_ARG(flags, mode);
  LS_REAL(openat64);
  int fd = real_openat64(dirfd, path, flags, mode);
  after_open(fd, path, flags);
  return fd;
}

/* The fortified forms (open without a mode argument, checked by glibc). */
int __open_2(const char* path, int flags) {
  LS_REAL(__open_2);
  int fd = real___open_2(path, flags);
  after_open(fd, path, flags);
  return fd;
}

int __open64_2(const char* path, int flags) {
  LS_REAL(__open64_2);
  int fd = real___open64_2(path, flags);
  after_open(fd, path, flags);
  return fd;
}

int __openat_2(int dirfd, const char* path, int flags) {
  LS_REAL(__openat_2);
  int fd = real___openat_2(dirfd, path, flags);
  after_open(fd, path, flags);
  return fd;
}

int __openat64_2(int dirfd, const char* path, int flags) {
  LS_REAL(__openat64_2);
  int fd = real___openat64_2(dirfd, path, flags);
  after_open(fd, path, flags);
  return fd;
}

/* ------------------------------------------------------------ fopen */

/* fread takes its bytes with libc's internal read, which no wrapper sees:
 * a FILE on a random device is a cookie stream serving its slot's stream
 * (the cookie is the slot number). */
static ssize_t cookie_read(void* cookie, char* buf, size_t len) {
  struct iovec v = {buf, len};
  slot_fill_iov((uint32_t)(uintptr_t)cookie, &v, 1, len);
  return (ssize_t)len;
}

static int cookie_close(void* cookie) {
  slot_give_back((uint32_t)(uintptr_t)cookie);
  return 0;
}

/* Read-only modes: "r", "rb", "re", "rce"...; anything with w, a or + is
 * left alone. */
static int read_only_mode(const char* mode) {
  return mode && mode[0] == 'r' && !strchr(mode, '+');
}

/* f, the real FILE for path, or a cookie stream in its place. */
static FILE* after_fopen(FILE* f, const char* path, const char* mode) {
  if (!f || !rnd_on || !is_random_path(path) || !read_only_mode(mode)) return f;
  int saved = errno;
  if (!is_random_device(fileno(f))) {
    errno = saved;
    return f;
  }
  uint32_t s = slot_take();
  cookie_io_functions_t io = {.read = cookie_read, .close = cookie_close};
  FILE* c = fopencookie((void*)(uintptr_t)s, "r", io);
  if (!c) {
    slot_give_back(s);
    shim_log("fopen(%s): no cookie stream (%s): this read is NOT the same on every replica", path,
             strerror(errno));
    errno = saved;
    return f;
  }
  fclose(f);
  errno = saved;
  return c;
}

FILE* fopen(const char* path, const char* mode) {
  LS_REAL(fopen);
  return after_fopen(real_fopen(path, mode), path, mode);
}

FILE* fopen64(const char* path, const char* mode) {
  LS_REAL(fopen64);
  return after_fopen(real_fopen64(path, mode), path, mode);
}

/* ------------------------------------------------------------ entropy calls */

ssize_t getrandom(void* buf, size_t len, unsigned int flags) {
  LS_REAL(getrandom);
  ssize_t n = real_getrandom(buf, len, flags);
  if (rnd_on && n > 0) entropy_fill(buf, (size_t)n);
  return n;
}

int getentropy(void* buf, size_t len) {
  LS_REAL(getentropy);
  int r = real_getentropy(buf, len);
  if (rnd_on && r == 0) entropy_fill(buf, len);
  return r;
}

void arc4random_buf(void* buf, size_t len) {
  if (rnd_on) {
    entropy_fill(buf, len);
    return;
  }
  LS_REAL(arc4random_buf);
  if (real_arc4random_buf) {
    real_arc4random_buf(buf, len);
    return;
  }
  /* A libc without arc4random: getrandom, and like glibc's arc4random,
   * never return without the bytes. */
  int saved = errno;
  LS_REAL(getrandom);
  for (size_t got = 0; got < len;) {
    ssize_t n = real_getrandom ? real_getrandom((char*)buf + got, len - got, 0) : -1;
    if (n > 0)
      got += (size_t)n;
    else if (n < 0 && errno != EINTR)
      abort();
  }
  errno = saved;
}

uint32_t arc4random(void) {
  if (!rnd_on) {
    LS_REAL(arc4random);
    if (real_arc4random) return real_arc4random();
  }
  uint32_t v;
  arc4random_buf(&v, sizeof v);
  return v;
}

uint32_t arc4random_uniform(uint32_t bound) {
  if (!rnd_on) {
    LS_REAL(arc4random_uniform);
    if (real_arc4random_uniform) return real_arc4random_uniform(bound);
  }
  if (bound < 2) return 0;
  uint32_t min = -bound % bound; /* 2^32 mod bound: values below are biased */
  for (;;) {
    uint32_t r = arc4random();
    if (r >= min) return r % bound;
  }
}

/* ------------------------------------------------------------ OpenSSL */

/* RAND_bytes and RAND_priv_bytes, for a server that calls them itself
 * (mariadbd's my_random_bytes: the nonce of an ed25519 login). Defined here
 * without OpenSSL's headers or library: the shim links nothing that could
 * clash with the server's own. The real call runs first (OpenSSL's errors
 * and return value stay its own); on success (1) its bytes are replaced by
 * the OpenSSL stream's. A stream of its own, not the entropy stream: OpenSSL
 * seeds its generators with getentropy (the wrapper above) whenever it
 * decides to, which may differ between replicas, and must not shift these
 * bytes. */
static int openssl_bytes(int (*real)(unsigned char*, int), unsigned char* buf, int num) {
  int r;
  if (real) {
    r = real(buf, num);
  } else {
    /* No libcrypto behind us (one loaded RTLD_LOCAL by a plugin): the
     * stream's bytes when same_random is on; otherwise getrandom's, and
     * OpenSSL's 0 (failure) if the kernel has none. */
    r = num < 0 ? 0 : 1;
    if (!rnd_on && num > 0) {
      int saved = errno;
      LS_REAL(getrandom);
      for (size_t got = 0; r == 1 && got < (size_t)num;) {
        ssize_t n = real_getrandom ? real_getrandom(buf + got, (size_t)num - got, 0) : -1;
        if (n > 0)
          got += (size_t)n;
        else if (n == 0 || errno != EINTR)
          r = 0;
      }
      errno = saved;
    }
  }
  if (rnd_on && r == 1 && num > 0) {
    uint64_t off = atomic_fetch_add(&rnd_openssl_off, (uint64_t)num);
    stream_fill(RND_NONCE(RND_DOM_OPENSSL, 0), off, buf, (size_t)num);
  }
  return r;
}

int RAND_bytes(unsigned char* buf, int num) {
  LS_REAL(RAND_bytes);
  return openssl_bytes(real_RAND_bytes, buf, num);
}

int RAND_priv_bytes(unsigned char* buf, int num) {
  LS_REAL(RAND_priv_bytes);
  return openssl_bytes(real_RAND_priv_bytes, buf, num);
}

/* ------------------------------------------------------------ libc generators */

void srand(unsigned int seed) {
  LS_REAL(srand);
  real_srand(rnd_on ? (unsigned int)next_seed() : seed);
}

void srandom(unsigned int seed) {
  LS_REAL(srandom);
  real_srandom(rnd_on ? (unsigned int)next_seed() : seed);
}

char* initstate(unsigned int seed, char* state, size_t n) {
  LS_REAL(initstate);
  return real_initstate(rnd_on ? (unsigned int)next_seed() : seed, state, n);
}

void srand48(long seed) {
  LS_REAL(srand48);
  real_srand48(rnd_on ? (long)next_seed() : seed);
}

/* 48 bits of the next seed, as seed48 takes them. */
static void next_seed48(unsigned short out[3]) {
  uint64_t v = next_seed();
  out[0] = (unsigned short)v;
  out[1] = (unsigned short)(v >> 16);
  out[2] = (unsigned short)(v >> 32);
}

unsigned short* seed48(unsigned short seed[3]) {
  LS_REAL(seed48);
  if (!rnd_on) return real_seed48(seed);
  unsigned short v[3];
  next_seed48(v);
  return real_seed48(v);
}

void lcong48(unsigned short param[7]) {
  LS_REAL(lcong48);
  if (!rnd_on) {
    real_lcong48(param);
    return;
  }
  unsigned short p[7]; /* the seed part replaced; the multiplier and addend kept */
  memcpy(p, param, sizeof p);
  next_seed48(p);
  real_lcong48(p);
}

int srandom_r(unsigned int seed, struct random_data* buf) {
  LS_REAL(srandom_r);
  return real_srandom_r(rnd_on ? (unsigned int)next_seed() : seed, buf);
}

int initstate_r(unsigned int seed, char* state, size_t n, struct random_data* buf) {
  LS_REAL(initstate_r);
  return real_initstate_r(rnd_on ? (unsigned int)next_seed() : seed, state, n, buf);
}

int srand48_r(long seed, struct drand48_data* buf) {
  LS_REAL(srand48_r);
  return real_srand48_r(rnd_on ? (long)next_seed() : seed, buf);
}

int seed48_r(unsigned short seed[3], struct drand48_data* buf) {
  LS_REAL(seed48_r);
  if (!rnd_on) return real_seed48_r(seed, buf);
  unsigned short v[3];
  next_seed48(v);
  return real_seed48_r(v, buf);
}

int lcong48_r(unsigned short param[7], struct drand48_data* buf) {
  LS_REAL(lcong48_r);
  if (!rnd_on) return real_lcong48_r(param, buf);
  unsigned short p[7];
  memcpy(p, param, sizeof p);
  next_seed48(p);
  return real_lcong48_r(p, buf);
}

/* ------------------------------------------------------------ the server's own generators */

/* Generators in the server's code, seeded from the clock: reseeded once,
 * when the server first listens (see the top of this file); OpenSSL's made
 * ready then too. */
static void reseed_app(void) {
  if (atomic_exchange(&rnd_app_reseeded, 1)) return;
  int saved = errno;
  uint8_t b[8];
  stream_fill(RND_NONCE(RND_DOM_APP, 0), 0, b, sizeof b);
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
  /* MT19937-64, the reference implementation (redis: dict.c's random picks). */
  void* init = dlsym(RTLD_DEFAULT, "init_genrand64");
  void* next = dlsym(RTLD_DEFAULT, "genrand64_int64");
  if (init && next) ((void (*)(unsigned long long))init)((unsigned long long)v);
  /* OpenSSL's generators, made ready before any client is served (their
   * bytes are thrown away): its first RAND_bytes loads providers and seeds
   * them, long enough for serial_inputs to find the thread asleep and let
   * the next input in, whose RAND_bytes would then take the stream's bytes
   * first. */
  LS_REAL(RAND_bytes);
  LS_REAL(RAND_priv_bytes);
  unsigned char warm[16];
  if (real_RAND_bytes) (void)real_RAND_bytes(warm, (int)sizeof warm);
  if (real_RAND_priv_bytes) (void)real_RAND_priv_bytes(warm, (int)sizeof warm);
  errno = saved;
}

int listen(int fd, int backlog) {
  listen_check(fd); /* shim_order.c: only the process lockstep started may serve the port */
  LS_REAL(listen);
  int r = real_listen(fd, backlog);
  if (rnd_on && r == 0 && !atomic_load_explicit(&rnd_app_reseeded, memory_order_relaxed))
    reseed_app();
  return r;
}
