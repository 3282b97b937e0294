// transport_ucx.cc — see transport_ucx.h.
#include "consensus/transport_ucx.h"

#include <poll.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace lockstep {

namespace {

constexpr unsigned kDoorbellAmId = 0x4c53;  // "LS"
constexpr int kMinBlockClass = 6;           // 64 bytes
constexpr int kMaxPooledClass = 24;         // 16 MiB; larger copies are not pooled
constexpr int kDrainLimit = 64;             // ucp_worker_progress calls per Progress()

using Clock = std::chrono::steady_clock;

std::string StatusString(const char* what, ucs_status_t status) {
  return std::string(what) + ": " + ucs_status_string(status);
}

void SetError(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
}

int SizeClass(size_t len) {
  int cls = kMinBlockClass;
  while (cls < 63 && (size_t{1} << cls) < len) ++cls;
  return cls;
}

const char* TlsFor(UcxTransport::Kind kind) {
  switch (kind) {
    case UcxTransport::Kind::kShm: return "posix,sysv,cma,self";
    case UcxTransport::Kind::kTcp: return "tcp,self";
    case UcxTransport::Kind::kAuto: return nullptr;
  }
  return nullptr;
}

}  // namespace

struct UcxTransport::Peer {
  UcxTransport* owner = nullptr;
  PeerId id = -1;
  ucp_ep_h ep = nullptr;
  bool closed = false;  // Disconnect() ran; ep is gone
  bool dead = false;    // UCX reported an endpoint error
  bool error_queued = false;
  std::string dead_reason;
  size_t pending_bytes = 0;  // copied puts not yet completed locally
  std::vector<RemoteId> remotes;
  std::vector<ucp_rkey_h> retired_rkeys;  // detached while puts were in flight
};

struct UcxTransport::Remote {
  Peer* peer = nullptr;
  ucp_rkey_h rkey = nullptr;
  uint64_t addr = 0;
  size_t size = 0;
};

// Header of a malloc'd copy buffer; the bytes follow it (data()).
struct alignas(64) UcxTransport::Block {
  UcxTransport* owner;
  Peer* peer;  // for pending-byte accounting (null for doorbells)
  size_t len;  // bytes in use
  size_t capacity;
  int cls;  // size class, or -1 if not pooled
  uint8_t* data() { return reinterpret_cast<uint8_t*>(this + 1); }
};

// UCX callbacks. Each one runs inside ucp_worker_progress (or an ep close);
// none calls user code.
struct UcxTransportCallbacks {
  static void PutDone(void* request, ucs_status_t status, void* user_data) {
    auto* block = static_cast<UcxTransport::Block*>(user_data);
    UcxTransport* t = block->owner;
    if (status != UCS_OK && status != UCS_ERR_CANCELED && block->peer != nullptr &&
        !block->peer->dead) {
      MarkDead(block->peer, StatusString("put failed", status));
    }
    if (t->stats_.puts_pending > 0) --t->stats_.puts_pending;
    t->ReleaseBlock(block);
    ucp_request_free(request);
  }

  static void AmSendDone(void* request, ucs_status_t status, void* user_data) {
    auto* block = static_cast<UcxTransport::Block*>(user_data);
    UcxTransport* t = block->owner;
    if (status != UCS_OK && status != UCS_ERR_CANCELED && block->peer != nullptr &&
        !block->peer->dead) {
      MarkDead(block->peer, StatusString("doorbell failed", status));
    }
    if (t->stats_.doorbells_pending > 0) --t->stats_.doorbells_pending;
    block->owner->ReleaseBlock(block);
    ucp_request_free(request);
  }

  static ucs_status_t Doorbell(void* arg, const void* header, size_t header_length, void* /*data*/,
                               size_t /*length*/, const ucp_am_recv_param_t* /*param*/) {
    auto* t = static_cast<UcxTransport*>(arg);
    uint64_t tag = 0;
    if (header != nullptr) std::memcpy(&tag, header, std::min(header_length, sizeof(tag)));
    t->queued_doorbells_.push_back(tag);
    ++t->stats_.doorbells_received;
    return UCS_OK;  // we keep no reference to the data
  }

  static void EpError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    auto* peer = static_cast<UcxTransport::Peer*>(arg);
    if (!peer->dead) MarkDead(peer, StatusString("endpoint error", status));
  }

  static void MarkDead(UcxTransport::Peer* peer, std::string reason) {
    peer->dead = true;
    peer->dead_reason = reason;
    if (!peer->error_queued && !peer->closed) {
      peer->error_queued = true;
      peer->owner->queued_errors_.emplace_back(peer->id, std::move(reason));
    }
  }
};

UcxTransport::UcxTransport(Kind kind) : kind_(kind) {}

std::unique_ptr<UcxTransport> UcxTransport::Create(Kind kind, std::string* error) {
  Options options;
  options.kind = kind;
  return Create(options, error);
}

std::unique_ptr<UcxTransport> UcxTransport::Create(const Options& options, std::string* error) {
  std::unique_ptr<UcxTransport> t(new UcxTransport(options.kind));
  if (!t->Init(options, error)) return nullptr;
  return t;
}

bool UcxTransport::Init(const Options& options, std::string* error) {
  long page = sysconf(_SC_PAGESIZE);
  if (page > 0) page_size_ = static_cast<size_t>(page);
  free_blocks_.resize(kMaxPooledClass + 1);
  max_pending_bytes_ = options.max_pending_bytes_per_peer;
  flush_spin_us_ = std::max(options.flush_spin_us, 0);

  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) {
    SetError(error, StatusString("ucp_config_read", status));
    return false;
  }
  auto modify = [&](const char* name, const std::string& value) {
    ucs_status_t s = ucp_config_modify(config, name, value.c_str());
    if (s != UCS_OK) {
      SetError(error,
               StatusString(("ucp_config_modify " + std::string(name) + "=" + value).c_str(), s));
      return false;
    }
    return true;
  };
  bool ok = true;
  if (const char* tls = TlsFor(options.kind)) ok = ok && modify("TLS", tls);
  if (ok && options.kind != Kind::kTcp) {
    // UCX 1.13's shared-memory transports hide their (keepalive-based) peer
    // failure support unless asked; without it an endpoint with
    // UCP_ERR_HANDLING_MODE_PEER finds no AM lane over shm ("Destination is
    // unreachable").
    ok = modify("MM_ERROR_HANDLING", "y");
  }
  if (ok && options.keepalive_ms > 0) {
    ok = modify("KEEPALIVE_INTERVAL", std::to_string(options.keepalive_ms) + "ms");
  }
  if (ok && !options.net_devices.empty() && options.kind != Kind::kShm) {
    ok = modify("NET_DEVICES", options.net_devices);
  }
  if (!ok) {
    ucp_config_release(config);
    return false;
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = options.name.c_str();
  status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (status != UCS_OK) {
    context_ = nullptr;
    SetError(error, StatusString("ucp_init", status));
    return false;
  }

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  status = ucp_worker_create(context_, &wparams, &worker_);
  if (status != UCS_OK) {
    worker_ = nullptr;
    SetError(error, StatusString("ucp_worker_create", status));
    return false;
  }

  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  status = ucp_worker_get_address(worker_, &addr, &addr_len);
  if (status != UCS_OK) {
    SetError(error, StatusString("ucp_worker_get_address", status));
    return false;
  }
  worker_address_.assign(reinterpret_cast<const char*>(addr), addr_len);
  ucp_worker_release_address(worker_, addr);

  status = ucp_worker_get_efd(worker_, &event_fd_);
  if (status != UCS_OK) {
    event_fd_ = -1;
    SetError(error, StatusString("ucp_worker_get_efd", status));
    return false;
  }

  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                  UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = kDoorbellAmId;
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  am.cb = &UcxTransportCallbacks::Doorbell;
  am.arg = this;
  status = ucp_worker_set_am_recv_handler(worker_, &am);
  if (status != UCS_OK) {
    SetError(error, StatusString("ucp_worker_set_am_recv_handler", status));
    return false;
  }
  queued_doorbells_.reserve(64);
  delivering_doorbells_.reserve(64);
  return true;
}

UcxTransport::~UcxTransport() {
  if (worker_ != nullptr) {
    // Close endpoints first (force: completes or cancels their requests), then
    // release rkeys that pending puts might still have referenced.
    for (auto& peer : peers_) {
      if (peer && !peer->closed && peer->ep != nullptr) CloseEp(peer.get(), true, 1000);
    }
    for (auto& remote : remotes_) {
      if (remote && remote->rkey != nullptr) ucp_rkey_destroy(remote->rkey);
    }
    remotes_.clear();
    for (auto& peer : peers_) {
      if (!peer) continue;
      for (ucp_rkey_h rkey : peer->retired_rkeys) ucp_rkey_destroy(rkey);
      peer->retired_rkeys.clear();
    }
  }
  if (context_ != nullptr) {
    for (size_t i = 0; i < regions_.size(); ++i) {
      if (regions_[i]) ucp_mem_unmap(context_, region_memh_[i]);
    }
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  for (Block* b : all_blocks_) std::free(b);
}

// ---------------------------------------------------------------- regions

UcxTransport::LocalRegion* UcxTransport::MapRegion(size_t size, std::string* error) {
  if (size == 0) {
    SetError(error, "MapRegion: size 0");
    return nullptr;
  }
  const size_t rounded = (size + page_size_ - 1) / page_size_ * page_size_;
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_PROT;
  mp.address = nullptr;
  // UCX allocates the memory itself: over shared memory it comes from the
  // sysv/posix memory domain, which is what lets a peer's put be a plain store.
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
            UCP_MEM_MAP_PROT_REMOTE_READ | UCP_MEM_MAP_PROT_REMOTE_WRITE;

  ucp_mem_h memh = nullptr;
  uint8_t* base = nullptr;
  for (int attempt = 0; attempt < 2 && base == nullptr; ++attempt) {
    mp.length = rounded + (attempt == 0 ? 0 : page_size_);
    ucs_status_t status = ucp_mem_map(context_, &mp, &memh);
    if (status != UCS_OK) {
      SetError(error, StatusString("ucp_mem_map", status));
      return nullptr;
    }
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    status = ucp_mem_query(memh, &attr);
    if (status != UCS_OK) {
      ucp_mem_unmap(context_, memh);
      SetError(error, StatusString("ucp_mem_query", status));
      return nullptr;
    }
    auto a = reinterpret_cast<uintptr_t>(attr.address);
    uintptr_t aligned = (a + page_size_ - 1) / page_size_ * page_size_;
    if (aligned + rounded <= a + attr.length) {
      base = reinterpret_cast<uint8_t*>(aligned);
    } else {
      ucp_mem_unmap(context_, memh);  // not page aligned: retry with one page of slack
      memh = nullptr;
    }
  }
  if (base == nullptr) {
    SetError(error, "ucp_mem_map: could not get page-aligned memory");
    return nullptr;
  }
  std::memset(base, 0, rounded);

  void* rkey_buf = nullptr;
  size_t rkey_len = 0;
  ucs_status_t status = ucp_rkey_pack(context_, memh, &rkey_buf, &rkey_len);
  if (status != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    SetError(error, StatusString("ucp_rkey_pack", status));
    return nullptr;
  }
  auto region = std::make_unique<LocalRegion>();
  region->base = base;
  region->size = rounded;
  region->packed_rkey.assign(static_cast<const char*>(rkey_buf), rkey_len);
  region->remote_addr = reinterpret_cast<uint64_t>(base);
  ucp_rkey_buffer_release(rkey_buf);

  LocalRegion* out = region.get();
  regions_.push_back(std::move(region));
  region_memh_.push_back(memh);
  return out;
}

void UcxTransport::UnmapRegion(LocalRegion* region) {
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i].get() == region) {
      ucp_mem_unmap(context_, region_memh_[i]);
      regions_.erase(regions_.begin() + static_cast<std::ptrdiff_t>(i));
      region_memh_.erase(region_memh_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
}

// ---------------------------------------------------------------- peers

UcxTransport::Peer* UcxTransport::GetPeer(PeerId id) const {
  if (id < 0 || static_cast<size_t>(id) >= peers_.size()) return nullptr;
  Peer* p = peers_[static_cast<size_t>(id)].get();
  return (p != nullptr && !p->closed) ? p : nullptr;
}

UcxTransport::PeerId UcxTransport::Connect(const std::string& peer_worker_address,
                                           std::string* error) {
  if (peer_worker_address.empty()) {
    SetError(error, "Connect: empty worker address");
    return -1;
  }
  auto peer = std::make_unique<Peer>();
  peer->owner = this;
  peer->id = static_cast<PeerId>(peers_.size());

  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(peer_worker_address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxTransportCallbacks::EpError;
  ep.err_handler.arg = peer.get();
  ucs_status_t status = ucp_ep_create(worker_, &ep, &peer->ep);
  if (status != UCS_OK) {
    SetError(error, StatusString("ucp_ep_create", status));
    return -1;
  }
  PeerId id = peer->id;
  peers_.push_back(std::move(peer));
  return id;
}

bool UcxTransport::PeerAlive(PeerId id) const {
  Peer* p = GetPeer(id);
  return p != nullptr && !p->dead;
}

void UcxTransport::CloseEp(Peer* peer, bool force, int timeout_ms) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(peer->ep, &param);
  peer->ep = nullptr;
  peer->closed = true;
  if (req == nullptr || UCS_PTR_IS_ERR(req)) return;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (ucp_request_check_status(req) == UCS_INPROGRESS && Clock::now() < deadline) {
    ucp_worker_progress(worker_);
  }
  // Freeing an unfinished request is allowed: UCX finishes the close on its own.
  ucp_request_free(req);
}

void UcxTransport::Disconnect(PeerId id, int flush_timeout_ms) {
  Peer* peer = GetPeer(id);
  if (peer == nullptr) return;
  if (!peer->dead && flush_timeout_ms > 0) {
    std::string ignored;
    Flush(id, flush_timeout_ms, &ignored);
  }
  // Force: never waits for a handshake with a peer that may be gone. It also
  // completes (with an error) every request still queued on the endpoint.
  std::vector<RemoteId> remotes = peer->remotes;
  CloseEp(peer, /*force=*/true, 1000);
  for (RemoteId r : remotes) DetachRemote(r);
  for (ucp_rkey_h rkey : peer->retired_rkeys) ucp_rkey_destroy(rkey);
  peer->retired_rkeys.clear();
  // Drop a not-yet-delivered error report for this peer.
  queued_errors_.erase(std::remove_if(queued_errors_.begin(), queued_errors_.end(),
                                      [id](const auto& e) { return e.first == id; }),
                       queued_errors_.end());
}

std::string UcxTransport::DescribePeer(PeerId id) const {
  Peer* peer = GetPeer(id);
  if (peer == nullptr) return "(no such peer)";
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (f == nullptr) return "(open_memstream failed)";
  ucp_ep_print_info(peer->ep, f);
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

// ---------------------------------------------------------------- remotes

UcxTransport::RemoteId UcxTransport::AttachRemote(PeerId id, uint64_t remote_addr,
                                                  const std::string& packed_rkey, size_t size,
                                                  std::string* error) {
  Peer* peer = GetPeer(id);
  if (peer == nullptr) {
    SetError(error, "AttachRemote: unknown peer " + std::to_string(id));
    return -1;
  }
  if (peer->dead) {
    SetError(error, "AttachRemote: peer " + std::to_string(id) + " is dead: " + peer->dead_reason);
    return -1;
  }
  if (packed_rkey.empty()) {
    SetError(error, "AttachRemote: empty rkey");
    return -1;
  }
  auto remote = std::make_unique<Remote>();
  remote->peer = peer;
  remote->addr = remote_addr;
  remote->size = size;
  ucs_status_t status = ucp_ep_rkey_unpack(peer->ep, packed_rkey.data(), &remote->rkey);
  if (status != UCS_OK) {
    SetError(error, StatusString("ucp_ep_rkey_unpack", status));
    return -1;
  }
  RemoteId rid = static_cast<RemoteId>(remotes_.size());
  remotes_.push_back(std::move(remote));
  peer->remotes.push_back(rid);
  return rid;
}

void UcxTransport::DetachRemote(RemoteId rid) {
  if (rid < 0 || static_cast<size_t>(rid) >= remotes_.size()) return;
  auto& remote = remotes_[static_cast<size_t>(rid)];
  if (!remote) return;
  Peer* peer = remote->peer;
  auto& list = peer->remotes;
  list.erase(std::remove(list.begin(), list.end(), rid), list.end());
  if (remote->rkey != nullptr) {
    if (peer->pending_bytes > 0 && !peer->closed) {
      // A queued put may still use this rkey: keep it until the endpoint is closed.
      peer->retired_rkeys.push_back(remote->rkey);
    } else {
      ucp_rkey_destroy(remote->rkey);
    }
  }
  remote.reset();
}

// ---------------------------------------------------------------- copy buffers

UcxTransport::Block* UcxTransport::GetBlock(size_t len) {
  int cls = SizeClass(len);
  if (cls <= kMaxPooledClass && !free_blocks_[cls].empty()) {
    Block* b = free_blocks_[cls].back();
    free_blocks_[cls].pop_back();
    b->len = len;
    return b;
  }
  size_t capacity = cls <= kMaxPooledClass ? (size_t{1} << cls) : len;
  void* mem = std::aligned_alloc(alignof(Block), (sizeof(Block) + capacity + alignof(Block) - 1) /
                                                     alignof(Block) * alignof(Block));
  if (mem == nullptr) return nullptr;
  Block* b = static_cast<Block*>(mem);
  b->owner = this;
  b->peer = nullptr;
  b->len = len;
  b->capacity = capacity;
  b->cls = cls <= kMaxPooledClass ? cls : -1;
  if (b->cls >= 0) all_blocks_.push_back(b);
  return b;
}

void UcxTransport::ReleaseBlock(Block* b) {
  if (b->peer != nullptr) {
    b->peer->pending_bytes -= std::min(b->peer->pending_bytes, b->len);
    b->peer = nullptr;
  }
  if (b->cls < 0) {
    std::free(b);
    return;
  }
  free_blocks_[b->cls].push_back(b);
}

// ---------------------------------------------------------------- data path

bool UcxTransport::Put(RemoteId rid, size_t offset, const void* data, size_t len,
                       std::string* error) {
  if (rid < 0 || static_cast<size_t>(rid) >= remotes_.size() ||
      !remotes_[static_cast<size_t>(rid)]) {
    SetError(error, "Put: unknown remote " + std::to_string(rid));
    return false;
  }
  Remote& r = *remotes_[static_cast<size_t>(rid)];
  Peer* peer = r.peer;
  if (peer->dead || peer->closed) {
    SetError(error, "Put: peer " + std::to_string(peer->id) + " is dead: " + peer->dead_reason);
    return false;
  }
  if (offset > r.size || len > r.size - offset) {
    SetError(error, "Put: range [" + std::to_string(offset) + ", +" + std::to_string(len) +
                        ") outside remote region of " + std::to_string(r.size) + " bytes");
    return false;
  }
  if (len == 0) return true;

  // Fast path: only accept completion inside the call, so UCX never keeps a
  // pointer to the caller's buffer. Over shm (and RDMA short puts) this is a
  // store into the peer's memory and nothing is allocated.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
  ucs_status_ptr_t sp = ucp_put_nbx(peer->ep, data, len, r.addr + offset, r.rkey, &param);
  if (sp == nullptr) {
    ++stats_.puts_immediate;
    return true;
  }
  if (UCS_PTR_IS_PTR(sp)) {
    // Not expected with FORCE_IMM_CMPL; be safe: the caller's buffer is
    // referenced, so wait for local completion before returning.
    while (ucp_request_check_status(sp) == UCS_INPROGRESS) ucp_worker_progress(worker_);
    ucs_status_t st = ucp_request_check_status(sp);
    ucp_request_free(sp);
    if (st != UCS_OK) {
      SetError(error, StatusString("ucp_put_nbx", st));
      return false;
    }
    ++stats_.puts_immediate;
    return true;
  }
  ucs_status_t status = UCS_PTR_STATUS(sp);
  if (status != UCS_ERR_NO_RESOURCE) {
    SetError(error, StatusString("ucp_put_nbx", status));
    return false;
  }

  // Slow path: copy into a pooled buffer that lives until UCX is done with it.
  if (peer->pending_bytes + len > max_pending_bytes_) {
    SetError(error, "Put: too many bytes in flight to peer " + std::to_string(peer->id) +
                        " (peer not draining)");
    return false;
  }
  Block* block = GetBlock(len);
  if (block == nullptr) {
    SetError(error, "Put: out of memory");
    return false;
  }
  std::memcpy(block->data(), data, len);
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxTransportCallbacks::PutDone;
  param.user_data = block;
  sp = ucp_put_nbx(peer->ep, block->data(), len, r.addr + offset, r.rkey, &param);
  ++stats_.puts_copied;
  if (sp == nullptr) {
    ReleaseBlock(block);
    return true;
  }
  if (UCS_PTR_IS_ERR(sp)) {
    ReleaseBlock(block);
    SetError(error, StatusString("ucp_put_nbx", UCS_PTR_STATUS(sp)));
    return false;
  }
  block->peer = peer;
  peer->pending_bytes += len;
  ++stats_.puts_pending;
  return true;  // PutDone releases the block and the request
}

bool UcxTransport::Ring(PeerId id, uint64_t tag, std::string* error) {
  Peer* peer = GetPeer(id);
  if (peer == nullptr) {
    SetError(error, "Ring: unknown peer " + std::to_string(id));
    return false;
  }
  if (peer->dead) {
    SetError(error, "Ring: peer " + std::to_string(id) + " is dead: " + peer->dead_reason);
    return false;
  }
  // UCX 1.13 has no UCP_AM_SEND_FLAG_COPY_HEADER: a pending AM may still read
  // its header, so the tag lives in a pooled block until completion.
  Block* block = GetBlock(sizeof(tag));
  if (block == nullptr) {
    SetError(error, "Ring: out of memory");
    return false;
  }
  std::memcpy(block->data(), &tag, sizeof(tag));
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  param.cb.send = &UcxTransportCallbacks::AmSendDone;
  param.user_data = block;
  ucs_status_ptr_t sp =
      ucp_am_send_nbx(peer->ep, kDoorbellAmId, block->data(), sizeof(tag), nullptr, 0, &param);
  if (sp == nullptr) {
    ReleaseBlock(block);
  } else if (UCS_PTR_IS_ERR(sp)) {
    ReleaseBlock(block);
    SetError(error, StatusString("ucp_am_send_nbx", UCS_PTR_STATUS(sp)));
    return false;
  } else {
    ++stats_.doorbells_pending;  // AmSendDone releases the block and the request
  }
  ++stats_.doorbells_sent;
  return true;
}

void UcxTransport::DeliverQueued() {
  // Handlers may call back into the transport (Put, Ring, even Progress);
  // a nested call leaves delivery to the outermost one.
  if (in_delivery_) return;
  in_delivery_ = true;
  for (int round = 0; round < 4 && (!queued_doorbells_.empty() || !queued_errors_.empty());
       ++round) {
    if (!queued_doorbells_.empty()) {
      delivering_doorbells_.swap(queued_doorbells_);
      for (uint64_t tag : delivering_doorbells_) {
        if (doorbell_handler_) doorbell_handler_(tag);
      }
      delivering_doorbells_.clear();
    }
    if (!queued_errors_.empty()) {
      auto errors = std::move(queued_errors_);
      queued_errors_.clear();
      for (auto& [id, message] : errors) {
        if (error_handler_ && GetPeer(id) != nullptr) error_handler_(id, message);
      }
    }
  }
  in_delivery_ = false;
}

bool UcxTransport::Progress() {
  int n = 0;
  while (n < kDrainLimit && ucp_worker_progress(worker_) != 0) ++n;
  bool delivered = !queued_doorbells_.empty() || !queued_errors_.empty();
  DeliverQueued();
  return n > 0 || delivered;
}

void UcxTransport::SetDoorbellHandler(std::function<void(uint64_t)> handler) {
  doorbell_handler_ = std::move(handler);
}

void UcxTransport::SetPeerErrorHandler(std::function<void(PeerId, std::string)> handler) {
  error_handler_ = std::move(handler);
}

bool UcxTransport::Arm() {
  if (!queued_doorbells_.empty() || !queued_errors_.empty()) return false;
  return ucp_worker_arm(worker_) == UCS_OK;  // UCS_ERR_BUSY: events pending
}

bool UcxTransport::Flush(PeerId id, int timeout_ms, std::string* error) {
  Peer* peer = GetPeer(id);
  if (peer == nullptr) {
    SetError(error, "Flush: unknown peer " + std::to_string(id));
    return false;
  }
  if (peer->dead) {
    SetError(error, "Flush: peer " + std::to_string(id) + " is dead: " + peer->dead_reason);
    return false;
  }
  ucp_request_param_t param{};
  ucs_status_ptr_t req = ucp_ep_flush_nbx(peer->ep, &param);
  if (req == nullptr) return true;
  if (UCS_PTR_IS_ERR(req)) {
    SetError(error, StatusString("ucp_ep_flush_nbx", UCS_PTR_STATUS(req)));
    return false;
  }
  const auto start = Clock::now();
  const auto spin_until = start + std::chrono::microseconds(flush_spin_us_);
  const auto deadline = start + std::chrono::milliseconds(std::max(timeout_ms, 0));
  ucs_status_t status = UCS_INPROGRESS;
  while (true) {
    ucp_worker_progress(worker_);
    status = ucp_request_check_status(req);
    if (status != UCS_INPROGRESS) break;
    if (peer->dead) {
      status = UCS_ERR_CONNECTION_RESET;
      break;
    }
    auto now = Clock::now();
    if (now >= deadline) {
      status = UCS_ERR_TIMED_OUT;
      break;
    }
    if (now >= spin_until && ucp_worker_arm(worker_) == UCS_OK) {
      // Sleep on the event fd, but wake at least every millisecond so that
      // keepalive (which runs only inside progress) can notice a dead peer.
      pollfd pfd{event_fd_, POLLIN, 0};
      poll(&pfd, 1, 1);
    }
  }
  ucp_request_free(req);
  if (status != UCS_OK) {
    if (peer->dead) {
      SetError(error, "Flush: peer " + std::to_string(id) + " is dead: " + peer->dead_reason);
    } else {
      SetError(error, StatusString("Flush", status));
    }
    return false;
  }
  return true;
}

}  // namespace lockstep
