// loadgen_ldap.c — loadgen's LDAPv3 codec (RFC 4511), with its own BER instead of libldap: the
// bind, add, modify and search requests, the parsing of their responses, and each connection's
// bind (and prefill's two entries above the keys) before the clock starts.
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen_proto.h"

enum { LDAP_BIND = NOPS, LDAP_SUFFIX, LDAP_OU };  // ldap requests made before the clock starts

#define BENCH_BASE "ou=bench,dc=lockstep,dc=test"
#define LDAP_MAX_MESSAGE (1 << 28)  // longer than any reply to our requests: garbled

// BER for LDAP (RFC 4511 5.1: one-byte tags, definite lengths). A request is encoded by
// running the same calls twice: the first run (p == NULL) only measures every constructed
// element, the second writes each header with its length in the shortest form, so the value
// is copied once and nothing has to be moved.
struct ber {
  unsigned char* p;  // NULL while measuring
  size_t n;
  int depth, next;  // elements open; constructed elements begun so far
  int idx[8];       // measuring: which element each open one is
  size_t start[8];  // measuring: n where each open element's contents begin
  size_t len[16];   // the contents' length of each constructed element, in order of beginning
};

static void ber_head(struct ber* b, unsigned char tag, size_t len) {
  int k = len < 0x80 ? 0 : len < 0x100 ? 1 : len < 0x10000 ? 2 : len < 0x1000000 ? 3 : 4;
  if (b->p) {
    b->p[b->n] = tag;
    b->p[b->n + 1] = (unsigned char)(k == 0 ? len : 0x80u | (unsigned)k);
    put_be(b->p + b->n + 2, len, k);
  }
  b->n += 2 + (size_t)k;
}

static void ber_put(struct ber* b, unsigned char tag, const void* v, size_t len) {
  ber_head(b, tag, len);
  if (b->p) memcpy(b->p + b->n, v, len);
  b->n += len;
}

static void ber_str(struct ber* b, unsigned char tag, const char* s) {
  ber_put(b, tag, s, strlen(s));
}

static void ber_int(struct ber* b, unsigned char tag, int v) {  // INTEGER or ENUMERATED, v >= 0
  unsigned char be[5] = {0, (unsigned char)(v >> 24), (unsigned char)(v >> 16),
                         (unsigned char)(v >> 8), (unsigned char)v};
  int i = 0;
  while (i < 4 && be[i] == 0 && !(be[i + 1] & 0x80)) i++;  // shortest two's complement
  ber_put(b, tag, be + i, (size_t)(5 - i));
}

static void ber_begin(struct ber* b, unsigned char tag) {
  int i = b->next++;
  if (b->p) {
    ber_head(b, tag, b->len[i]);
  } else {
    b->idx[b->depth] = i;
    b->start[b->depth] = b->n;
  }
  b->depth++;
}

static void ber_end(struct ber* b) {
  b->depth--;
  if (!b->p) {  // now the length is known, and with it the header's size
    size_t len = b->n - b->start[b->depth];
    b->len[b->idx[b->depth]] = len;
    ber_head(b, 0, len);
  }
}

// An Attribute (or a modification's PartialAttribute): SEQUENCE { type, SET OF value }.
static void attr_begin(struct ber* b, const char* type) {
  ber_begin(b, 0x30);
  ber_str(b, 0x04, type);
  ber_begin(b, 0x31);
}

static void attr_end(struct ber* b) {
  ber_end(b);
  ber_end(b);
}

static void ber_attr(struct ber* b, const char* type, const char* v) {
  attr_begin(b, type);
  ber_str(b, 0x04, v);
  attr_end(b);
}

static void ber_description(struct ber* b, const struct engine* e) {
  attr_begin(b, "description");
  ber_put(b, 0x04, e->value, (size_t)e->cfg->value_bytes);
  attr_end(b);
}

// The LDAPMessage for request req (an op or LDAP_*) with message id c->msgid; k is the key
// (add: the entry number). Sets c->expect to the response's protocolOp tag.
static void ldap_request(struct ber* b, struct conn* c, int req, long k) {
  char cn[48], dn[96];
  if (req == OP_ADD) {
    snprintf(cn, sizeof cn, "k%d-%ld", c->id, k);
  } else {
    snprintf(cn, sizeof cn, "key%ld", k);
  }
  snprintf(dn, sizeof dn, "cn=%s," BENCH_BASE, cn);
  ber_begin(b, 0x30);
  ber_int(b, 0x02, c->msgid);
  switch (req) {
    case LDAP_BIND:  // BindRequest: version 3, name, simple [0] password
      c->expect = 0x61;
      ber_begin(b, 0x60);
      ber_int(b, 0x02, 3);
      ber_str(b, 0x04, c->engine->cfg->bind_dn);
      ber_str(b, 0x80, c->engine->cfg->password);
      break;
    case LDAP_SUFFIX:  // AddRequest: entry, attributes
      c->expect = 0x69;
      ber_begin(b, 0x68);
      ber_str(b, 0x04, "dc=lockstep,dc=test");
      ber_begin(b, 0x30);
      attr_begin(b, "objectClass");
      ber_str(b, 0x04, "dcObject");
      ber_str(b, 0x04, "organization");
      attr_end(b);
      ber_attr(b, "dc", "lockstep");
      ber_attr(b, "o", "lockstep");
      ber_end(b);
      break;
    case LDAP_OU:
      c->expect = 0x69;
      ber_begin(b, 0x68);
      ber_str(b, 0x04, BENCH_BASE);
      ber_begin(b, 0x30);
      ber_attr(b, "objectClass", "organizationalUnit");
      ber_attr(b, "ou", "bench");
      ber_end(b);
      break;
    case OP_ADD:
    case OP_PREFILL:
      c->expect = 0x69;
      ber_begin(b, 0x68);
      ber_str(b, 0x04, dn);
      ber_begin(b, 0x30);
      ber_attr(b, "objectClass", "person");
      ber_attr(b, "cn", cn);
      ber_attr(b, "sn", "bench");
      ber_description(b, c->engine);
      ber_end(b);
      break;
    case OP_MODIFY:  // ModifyRequest: object, changes: one replace (2) of the description
      c->expect = 0x67;
      ber_begin(b, 0x66);
      ber_str(b, 0x04, dn);
      ber_begin(b, 0x30);
      ber_begin(b, 0x30);
      ber_int(b, 0x0a, 2);
      ber_description(b, c->engine);
      ber_end(b);
      ber_end(b);
      break;
    default:  // OP_SEARCH
      // SearchRequest: base, scope baseObject, neverDerefAliases, no size or time limit,
      // typesOnly FALSE, filter (objectClass=*), attributes
      c->expect = 0x65;
      ber_begin(b, 0x63);
      ber_str(b, 0x04, dn);
      ber_int(b, 0x0a, 0);
      ber_int(b, 0x0a, 0);
      ber_int(b, 0x02, 0);
      ber_int(b, 0x02, 0);
      ber_put(b, 0x01, "", 1);  // the BOOLEAN's one zero byte
      ber_str(b, 0x87, "objectClass");
      ber_begin(b, 0x30);
      ber_str(b, 0x04, "description");
      ber_end(b);
  }
  ber_end(b);  // the protocolOp
  ber_end(b);  // the LDAPMessage
}

// The request req (an op or LDAP_*) at c->req; its length.
static size_t format_ldap_request(struct conn* c, int req, long k) {
  c->msgid = c->msgid == INT_MAX ? 1 : c->msgid + 1;  // 0 is for unsolicited notifications
  struct ber b = {0};
  ldap_request(&b, c, req, k);
  b.p = (unsigned char*)c->req;  // b.len keeps the lengths just measured
  b.n = 0;
  b.next = 0;
  ldap_request(&b, c, req, k);
  return b.n;
}

// Reads the tag and length of the BER element at p (n bytes there). Returns the header's
// size, 0 if more bytes are needed, -1 if it is not BER as LDAP uses it (a multi-byte tag,
// an indefinite length) or longer than any reply to our requests.
static int ber_get_head(const unsigned char* p, size_t n, unsigned char* tag, size_t* len) {
  if (n < 2) return 0;
  if ((p[0] & 0x1f) == 0x1f) return -1;
  *tag = p[0];
  if (p[1] < 0x80) {
    *len = p[1];
    return 2;
  }
  size_t k = p[1] & 0x7fu;
  if (k == 0 || k > 4) return -1;
  if (n < 2 + k) return 0;
  size_t l = (size_t)get_be(p + 2, (int)k);
  if (l > LDAP_MAX_MESSAGE) return -1;
  *len = l;
  return 2 + (int)k;
}

// Reads the element with tag `tag` at *p, which must lie wholly before end; moves *p past it.
static int ber_get(const unsigned char** p, const unsigned char* end, unsigned char tag,
                   const unsigned char** v, size_t* len) {
  unsigned char t;
  int h = ber_get_head(*p, (size_t)(end - *p), &t, len);
  if (h <= 0 || t != tag || *len > (size_t)(end - *p) - (size_t)h) return -1;
  *v = *p + h;
  *p += (size_t)h + *len;
  return 0;
}

static int ber_get_int(const unsigned char** p, const unsigned char* end, unsigned char tag,
                       int* out) {
  const unsigned char* v;
  size_t len;
  if (ber_get(p, end, tag, &v, &len) < 0 || len == 0 || len > 4 || (v[0] & 0x80)) return -1;
  *out = (int)get_be(v, (int)len);  // below 2^31: the sign bit is clear
  return 0;
}

// Decodes the LDAPMessage at the head of buf: returns its size, 0 if it is not all there yet,
// -1 if it is malformed. *code is its LDAPResult's resultCode, *diag its diagnosticMessage;
// *code is -1 for a SearchResultEntry or SearchResultReference, which carry none.
static long ldap_message(const unsigned char* buf, size_t len, int* msgid, unsigned char* op,
                         int* code, const unsigned char** diag, size_t* diag_len) {
  unsigned char tag;
  size_t n, opn;
  int h = ber_get_head(buf, len, &tag, &n);
  if (h <= 0) return h;
  if (tag != 0x30) return -1;
  if (n > len - (size_t)h) return 0;
  const unsigned char *p = buf + h, *end = p + n, *dn;
  if (ber_get_int(&p, end, 0x02, msgid) < 0) return -1;
  int oh = ber_get_head(p, (size_t)(end - p), op, &opn);  // controls may follow: not read
  if (oh <= 0 || opn > (size_t)(end - p) - (size_t)oh || (*op & 0xe0) != 0x60) return -1;
  *code = -1;
  if (*op != 0x64 && *op != 0x73) {  // LDAPResult: resultCode, matchedDN, diagnosticMessage
    const unsigned char *q = p + oh, *qend = q + opn;
    size_t dnl;
    if (ber_get_int(&q, qend, 0x0a, code) < 0 || ber_get(&q, qend, 0x04, &dn, &dnl) < 0 ||
        ber_get(&q, qend, 0x04, diag, diag_len) < 0)
      return -1;
  }
  return h + (long)n;
}

static const char* format_ldap(struct conn* c, int op, long k, size_t* n) {
  *n = format_ldap_request(c, op, k);
  return c->req;
}

// An LDAP reply: the response to c->msgid, after any SearchResultEntry for a search.
static long parse_ldap(struct conn* c, int* kind) {
  int bench_op = c->engine->cfg->op;  // --op, which says what codes are misses
  size_t off = 0;
  for (;;) {
    int id, code;
    unsigned char op;
    const unsigned char* diag;
    size_t diag_len;
    long m = ldap_message((const unsigned char*)c->buf + off, c->len - off, &id, &op, &code, &diag,
                          &diag_len);
    if (m <= 0) return m;
    off += (size_t)m;
    if (id != c->msgid) {
      c->lost = id == 0 ? "unsolicited notification (notice of disconnection?)"
                        : "reply to another message id";
      return -1;
    }
    if (code < 0 && c->expect == 0x65) continue;  // an entry or a referral: read and skipped
    if (op != c->expect) return -1;
    c->result = code;
    if (code == 0) {
      *kind = REPLY_OK;
    } else if ((code == 32 && (bench_op == OP_MODIFY || bench_op == OP_SEARCH)) ||
               (code == 68 && bench_op == OP_PREFILL)) {
      *kind = REPLY_MISS;  // noSuchObject; entryAlreadyExists
    } else {
      *kind = REPLY_ERROR;
    }
    return (long)off;
  }
}

static const char* ldap_code_name(int code) {
  switch (code) {
    case 0: return "success";
    case 1: return "operationsError";
    case 2: return "protocolError";
    case 7: return "authMethodNotSupported";
    case 8: return "strongerAuthRequired";
    case 17: return "undefinedAttributeType";
    case 21: return "invalidAttributeSyntax";
    case 32: return "noSuchObject";
    case 34: return "invalidDNSyntax";
    case 48: return "inappropriateAuthentication";
    case 49: return "invalidCredentials";
    case 50: return "insufficientAccessRights";
    case 51: return "busy";
    case 52: return "unavailable";
    case 53: return "unwillingToPerform";
    case 64: return "namingViolation";
    case 65: return "objectClassViolation";
    case 68: return "entryAlreadyExists";
    case 80: return "other";
    default: return "see RFC 4511";
  }
}

// Before the clock starts: a simple bind, and for prefill on the first connection the two
// entries above the keys, which the other connections' adds need (entryAlreadyExists is fine).
static void setup_ldap(struct conn* c) {
  const struct engine* e = c->engine;
  const struct config* cfg = e->cfg;
  int reqs[3] = {LDAP_BIND, LDAP_SUFFIX, LDAP_OU};
  int nreqs = cfg->op == OP_PREFILL && c->id == 0 ? 3 : 1;
  for (int i = 0; i < nreqs; i++) {
    int kind = e->round_trip(c, c->req, format_ldap_request(c, reqs[i], 0));
    const char* what = reqs[i] == LDAP_BIND ? "bind as"
                       : reqs[i] == LDAP_OU ? "add of " BENCH_BASE " by"
                                            : "add of dc=lockstep,dc=test by";
    if (kind < 0) {
      fprintf(stderr, "loadgen: ldap %s %s on %s:%s failed: %s; read: ", what, cfg->bind_dn,
              cfg->host, cfg->port, c->lost);
      e->print_reply(c);
      exit(1);
    }
    if (c->result == 0 || (c->result == 68 && reqs[i] != LDAP_BIND)) continue;
    int id, code;
    unsigned char op;
    const unsigned char* diag = (const unsigned char*)"";
    size_t diag_len = 0;
    ldap_message((const unsigned char*)c->buf, c->len, &id, &op, &code, &diag, &diag_len);
    fprintf(stderr, "loadgen: ldap %s %s on %s:%s refused: resultCode %d (%s)%s%.*s\n", what,
            cfg->bind_dn, cfg->host, cfg->port, c->result, ldap_code_name(c->result),
            diag_len ? ": " : "", (int)diag_len, (const char*)diag);
    exit(1);
  }
}

const struct protocol ldap_protocol = {
    .name = "ldap",
    .ops = 1 << OP_ADD | 1 << OP_MODIFY | 1 << OP_SEARCH | 1 << OP_PREFILL,
    .default_op = -1,
    .needs_op = "add, modify, search or prefill",
    .set_op = -1,
    .get_op = -1,
    .prefill_requests = 1,
    .setup = setup_ldap,
    .format = format_ldap,
    .parse = parse_ldap,
};
