//go:build ignore

// torch.cpp — the fake libtorch_cpu.so: c10d::ProcessGroupGloo's collectives,
// c10d::Work::wait and c10::ivalue::Future::wait under their real
// Itanium-mangled names (the torch probes of bpf/probes.go match
// "c10d::ProcessGroupGloo::allreduce" and friends by mangled prefix), on the
// simulated GPU of fakegpu.c.
//
// As in torch, a collective only queues work and returns a Work: the fake
// enqueues one communication instance on the process group's own stream,
// ordered after the caller's stream (gloo's CUDA path records an event on
// the current stream), so ranks are coupled exactly as with the fake NCCL.
// The host waits for a collective either in Work::wait or, as DDP's reducer
// does, in c10::ivalue::Future::wait on the work's future (Work::getFuture
// right after the collective; Reducer::finalize_backward waits on each
// bucket's future in turn): the future blocks until its work completed,
// then orders the current stream after it (synchronizeWithCurrentStreams).
// With SLOWRANK_FAKE_GLOO_CUDA_SYNC set, each collective also calls the
// exported cudaStreamSynchronize once on an idle copy stream, the event
// pattern of gloo's CUDA path (its worker thread synchronises the stream
// of the device-to-host copy once per bucket).
//
// Under SLOWRANK_FAKE_ECHO (echo.c, for the probe tests) a process group
// joins nothing and its collectives and waits return at once: the probes'
// `this` and argument registers are the same, the simulator is not used.
//
// The C entry points slowrank_fake_gloo_* are the "Python binding" the fake
// trainer (and bpf/'s probe test) calls; they are not part of torch and must
// never be probed. The probed methods are noinline and called once per user
// call.
//
// Build: test/fakelibs/fakelibs.mk (g++, C++17).

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include <dlfcn.h>

extern "C" {
#include "fakegpu.h"
}

#define TORCH_API __attribute__((visibility("default")))
#define PROBED __attribute__((noinline))
#define HIDDEN __attribute__((visibility("hidden")))

namespace at {
class TORCH_API Tensor {
 public:
  double bytes = 0;
};
}  // namespace at

namespace c10 {
// Owning pointer with a destructor: a class return value, so the methods
// returning it take the return slot in rdi and `this` in rsi, as in torch.
template <class T>
class intrusive_ptr {
 public:
  explicit intrusive_ptr(T* p = nullptr) : p_(p) {}
  intrusive_ptr(intrusive_ptr&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  intrusive_ptr(const intrusive_ptr&) = delete;
  intrusive_ptr& operator=(intrusive_ptr&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~intrusive_ptr() { delete p_; }
  T* get() const { return p_; }
  T* operator->() const { return p_; }

 private:
  T* p_;
};
}  // namespace c10

namespace c10d {
class ProcessGroupGloo;
}  // namespace c10d

namespace c10 {
namespace ivalue {

// The future of one c10d work (c10::ivalue::Future::wait() is
// _ZN3c106ivalue6Future4waitEv, `this` in rdi, as in torch 2.x).
class TORCH_API Future {
 public:
  Future(c10d::ProcessGroupGloo* pg, struct CUevent_st* done) : pg_(pg), done_(done) {}
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;
  ~Future();
  // Blocks until the work completed, then makes the current stream wait for
  // it.
  void wait();

 private:
  c10d::ProcessGroupGloo* pg_;
  struct CUevent_st* done_;  // recorded after the work on the group's stream; null: the whole stream
};

}  // namespace ivalue
}  // namespace c10

namespace c10d {

struct BroadcastOptions {};
struct AllreduceOptions {};
struct AllreduceCoalescedOptions {};
struct ReduceOptions {};
struct AllgatherOptions {};
struct ReduceScatterOptions {};
struct AllToAllOptions {};
struct BarrierOptions {};

class ProcessGroupGloo;

class TORCH_API Work {
 public:
  explicit Work(ProcessGroupGloo* pg) : pg_(pg) {}
  virtual ~Work() = default;
  // Blocks until the collective (and those queued before it) completed.
  virtual bool wait(std::chrono::milliseconds timeout);
  // The future completed with the collective: call it right after the
  // collective, as DDP does (it marks the group's stream at that point).
  virtual c10::intrusive_ptr<c10::ivalue::Future> getFuture();

 private:
  ProcessGroupGloo* pg_;
};

class TORCH_API ProcessGroupGloo {
 public:
  ProcessGroupGloo(int slot, int rank, int size) : slot_(slot), rank_(rank), size_(size) {}
  HIDDEN ~ProcessGroupGloo() {
    keptFutures.clear();  // they give their events back
    keptWorks.clear();
    for (auto* e : freeEvents_) slowrank_fake_event_destroy(e);
  }

  c10::intrusive_ptr<Work> broadcast(std::vector<at::Tensor>& tensors, const BroadcastOptions& opts);
  c10::intrusive_ptr<Work> allreduce(std::vector<at::Tensor>& tensors, const AllreduceOptions& opts);
  c10::intrusive_ptr<Work> allreduce_coalesced(std::vector<at::Tensor>& tensors, const AllreduceCoalescedOptions& opts);
  c10::intrusive_ptr<Work> reduce(std::vector<at::Tensor>& tensors, const ReduceOptions& opts);
  c10::intrusive_ptr<Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                const ReduceScatterOptions& opts);
  c10::intrusive_ptr<Work> _allgather_base(at::Tensor& output, at::Tensor& input, const AllgatherOptions& opts);
  c10::intrusive_ptr<Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                     const AllgatherOptions& opts);
  c10::intrusive_ptr<Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const AllgatherOptions& opts);
  c10::intrusive_ptr<Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                          std::vector<std::vector<at::Tensor>>& inputs,
                                          const ReduceScatterOptions& opts);
  c10::intrusive_ptr<Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const ReduceScatterOptions& opts);
  c10::intrusive_ptr<Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputCounts,
                                         std::vector<int64_t>& inputCounts, const AllToAllOptions& opts);
  c10::intrusive_ptr<Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag);
  c10::intrusive_ptr<Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag);
  c10::intrusive_ptr<Work> barrier(const BarrierOptions& opts);

  // Not torch (hidden, so never taken for a probed method).
  HIDDEN int init(int cudaSync);
  HIDDEN void leave() {
    if (!echo()) slowrank_fake_comm_leave(slot_, rank_);
  }
  // Echo mode: joined no communicator, has no streams.
  HIDDEN bool echo() const { return slot_ < 0; }
  // Events for futures: a bounded pool (the simulator has 128 events per
  // process); without a free one a future waits for the whole stream.
  HIDDEN struct CUevent_st* takeEvent();
  HIDDEN void giveEvent(struct CUevent_st* e) { freeEvents_.push_back(e); }
  // Work kept for the end of the backward pass, in issue order.
  std::vector<c10::intrusive_ptr<Work>> keptWorks;
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> keptFutures;
  struct CUstream_st* caller = nullptr;  // the "current stream" of the next call
  struct CUstream_st* stream = nullptr;  // where the communication runs
  struct CUevent_st* done = nullptr;     // recorded by slowrank_fake_gloo_join
  int err = FG_OK;

 private:
  HIDDEN c10::intrusive_ptr<Work> enqueue(double bytesPerRank, int kind = FG_INST_COLL, int peer = 0, int isSend = 0);

  int slot_, rank_, size_;
  uint64_t seq_ = 0;
  std::vector<uint64_t> sent_, received_;
  struct CUstream_st* copy_ = nullptr;
  struct CUevent_st* ready_ = nullptr;
  int (*cudaSync_)(struct CUstream_st*) = nullptr;
  std::vector<struct CUevent_st*> freeEvents_;
  int futureEvents_ = 0;
};

// At most this many futures of a group are pending with their own event.
static const int kFutureEvents = 64;

struct CUevent_st* ProcessGroupGloo::takeEvent() {
  if (!freeEvents_.empty()) {
    struct CUevent_st* e = freeEvents_.back();
    freeEvents_.pop_back();
    return e;
  }
  struct CUevent_st* e = nullptr;
  if (futureEvents_ >= kFutureEvents || slowrank_fake_event_create(&e) != FG_OK) return nullptr;
  futureEvents_++;
  return e;
}

static double bytesOf(const std::vector<at::Tensor>& ts) {
  double b = 0;
  for (const auto& t : ts) b += t.bytes;
  return b;
}

int ProcessGroupGloo::init(int cudaSync) {
  sent_.assign(size_, 0);
  received_.assign(size_, 0);
  int e = slowrank_fake_stream_create(&stream);
  if (e == FG_OK) e = slowrank_fake_event_create(&ready_);
  if (e == FG_OK) e = slowrank_fake_event_create(&done);
  if (e == FG_OK && cudaSync) {
    e = slowrank_fake_stream_create(&copy_);
    // The exported runtime function, so that its probe sees the call.
    *reinterpret_cast<void**>(&cudaSync_) = dlsym(RTLD_DEFAULT, "cudaStreamSynchronize");
    if (!cudaSync_) e = FG_EINIT;
  }
  return e;
}

c10::intrusive_ptr<Work> ProcessGroupGloo::enqueue(double bytesPerRank, int kind, int peer, int isSend) {
  if (echo()) return c10::intrusive_ptr<Work>(new Work(this));
  const struct fg_params* prm = slowrank_fake_params();
  struct fg_inst_desc d = {};
  d.comm = slot_;
  d.kind = kind;
  d.rank = rank_;
  d.xfer_ns = prm->lat_ns + static_cast<uint64_t>(bytesPerRank / prm->bw_gbps);
  if (kind == FG_INST_COLL) {
    d.seq = seq_++;
  } else {
    d.peer = peer;
    d.is_send = isSend;
    d.seq = isSend ? sent_[peer]++ : received_[peer]++;
  }
  int e = FG_OK;
  if (caller) {
    e = slowrank_fake_event_record(ready_, caller);
    if (e == FG_OK) e = slowrank_fake_stream_wait_event(stream, ready_);
  }
  if (e == FG_OK) e = slowrank_fake_comm_enqueue(stream, &d, 1);
  if (e == FG_OK && cudaSync_ && cudaSync_(copy_) != 0) e = FG_EPEER;
  if (e != FG_OK && err == FG_OK) err = e;
  return c10::intrusive_ptr<Work>(new Work(this));
}

PROBED bool Work::wait(std::chrono::milliseconds) {
  if (pg_->echo()) return true;
  int e = slowrank_fake_stream_sync(pg_->stream);
  if (e != FG_OK && pg_->err == FG_OK) pg_->err = e;
  return e == FG_OK;
}

c10::intrusive_ptr<c10::ivalue::Future> Work::getFuture() {
  struct CUevent_st* ev = pg_->echo() ? nullptr : pg_->takeEvent();
  if (ev && slowrank_fake_event_record(ev, pg_->stream) != FG_OK) {
    pg_->giveEvent(ev);
    ev = nullptr;
  }
  return c10::intrusive_ptr<c10::ivalue::Future>(new c10::ivalue::Future(pg_, ev));
}

// Bytes each rank moves, as the fake NCCL models the ring algorithms.
#define RING_ALLREDUCE(b) ((b)*2.0 * (size_ - 1) / size_)

PROBED c10::intrusive_ptr<Work> ProcessGroupGloo::broadcast(std::vector<at::Tensor>& t, const BroadcastOptions&) {
  return enqueue(bytesOf(t));
}
PROBED c10::intrusive_ptr<Work> ProcessGroupGloo::allreduce(std::vector<at::Tensor>& t, const AllreduceOptions&) {
  return enqueue(RING_ALLREDUCE(bytesOf(t)));
}
PROBED c10::intrusive_ptr<Work> ProcessGroupGloo::allreduce_coalesced(std::vector<at::Tensor>& t,
                                                                      const AllreduceCoalescedOptions&) {
  return enqueue(RING_ALLREDUCE(bytesOf(t)));
}
PROBED c10::intrusive_ptr<Work> ProcessGroupGloo::reduce(std::vector<at::Tensor>& t, const ReduceOptions&) {
  return enqueue(bytesOf(t));
}
PROBED c10::intrusive_ptr<Work> ProcessGroupGloo::_reduce_scatter_base(at::Tensor& out, at::Tensor&,
                                                                       const ReduceScatterOptions&) {
  return enqueue(out.bytes * (size_ - 1));
}
PROBED c10::intrusive_ptr<Work> ProcessGroupGloo::_allgather_base(at::Tensor&, at::Tensor& in,
                                                                  const AllgatherOptions&) {
  return enqueue(in.bytes * (size_ - 1));
}
PROBED c10::intrusive_ptr<Work> ProcessGroupGloo::allgather(std::vector<std::vector<at::Tensor>>&,
                                                            std::vector<at::Tensor>& in, const AllgatherOptions&) {
  return enqueue(bytesOf(in) * (size_ - 1));
}
PROBED c10::intrusive_ptr<Work> ProcessGroupGloo::allgather_into_tensor_coalesced(std::vector<at::Tensor>&,
                                                                                  std::vector<at::Tensor>& in,
                                                                                  const AllgatherOptions&) {
  return enqueue(bytesOf(in) * (size_ - 1));
}
PROBED c10::intrusive_ptr<Work> ProcessGroupGloo::reduce_scatter(std::vector<at::Tensor>& out,
                                                                 std::vector<std::vector<at::Tensor>>&,
                                                                 const ReduceScatterOptions&) {
  return enqueue(bytesOf(out) * (size_ - 1));
}
PROBED c10::intrusive_ptr<Work> ProcessGroupGloo::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& out,
                                                                                  std::vector<at::Tensor>&,
                                                                                  const ReduceScatterOptions&) {
  return enqueue(bytesOf(out) * (size_ - 1));
}
PROBED c10::intrusive_ptr<Work> ProcessGroupGloo::alltoall_base(at::Tensor&, at::Tensor& in, std::vector<int64_t>&,
                                                                std::vector<int64_t>&, const AllToAllOptions&) {
  return enqueue(in.bytes * (size_ - 1) / size_);
}
PROBED c10::intrusive_ptr<Work> ProcessGroupGloo::send(std::vector<at::Tensor>& t, int dstRank, int) {
  return enqueue(bytesOf(t), FG_INST_P2P, dstRank, 1);
}
PROBED c10::intrusive_ptr<Work> ProcessGroupGloo::recv(std::vector<at::Tensor>& t, int srcRank, int) {
  return enqueue(bytesOf(t), FG_INST_P2P, srcRank, 0);
}
PROBED c10::intrusive_ptr<Work> ProcessGroupGloo::barrier(const BarrierOptions&) { return enqueue(0); }

}  // namespace c10d

namespace c10 {
namespace ivalue {

Future::~Future() {
  if (done_) pg_->giveEvent(done_);
}

PROBED void Future::wait() {
  if (pg_->echo()) return;
  int e = done_ ? slowrank_fake_event_sync(done_) : slowrank_fake_stream_sync(pg_->stream);
  if (e == FG_OK && done_ && pg_->caller) e = slowrank_fake_stream_wait_event(pg_->caller, done_);
  if (e != FG_OK && pg_->err == FG_OK) pg_->err = e;
}

}  // namespace ivalue
}  // namespace c10

// ---- the fake trainer's entry points (not torch; never probe them) ----

using c10d::ProcessGroupGloo;

// slowrank_fake_gloo_new joins the process group named key (all ranks of
// the job pass the same key) and waits for every rank. NULL on failure.
extern "C" TORCH_API void* slowrank_fake_gloo_new(const char* key, int size, int rank) {
  if (!key || size < 1 || size > FG_MAX_RANKS || rank < 0 || rank >= size) return nullptr;
  if (slowrank_fake_echo()) return new ProcessGroupGloo(-1, rank, size);
  if (slowrank_fake_init() != FG_OK) return nullptr;
  unsigned char k[FG_KEY_BYTES] = {};
  std::strncpy(reinterpret_cast<char*>(k), "gloo:", sizeof k);
  std::strncat(reinterpret_cast<char*>(k), key, sizeof k - 6);
  int slot = -1;
  if (slowrank_fake_comm_join(k, size, rank, &slot) != FG_OK) return nullptr;
  if (slowrank_fake_comm_wait_ready(slot) != FG_OK) {
    slowrank_fake_comm_leave(slot, rank);
    return nullptr;
  }
  const char* v = std::getenv("SLOWRANK_FAKE_GLOO_CUDA_SYNC");
  auto* pg = new ProcessGroupGloo(slot, rank, size);
  if (pg->init(v && *v && std::strcmp(v, "0") != 0) != FG_OK) {
    pg->leave();
    delete pg;
    return nullptr;
  }
  return pg;
}

// What slowrank_fake_gloo_call does with the Work (the trainer passes the
// same numbers).
enum {
  FAKE_GLOO_NO_WAIT = 0,      // drop it (slowrank_fake_gloo_join orders the device)
  FAKE_GLOO_WAIT_NOW = 1,     // Work::wait now (a blocking collective)
  FAKE_GLOO_KEEP_FUTURE = 2,  // keep work->getFuture() for slowrank_fake_gloo_finalize (DDP)
  FAKE_GLOO_KEEP_WORK = 3     // keep the Work for slowrank_fake_gloo_finalize
};

// slowrank_fake_gloo_call issues one collective ("allreduce", "broadcast",
// "allgather", "reduce_scatter", "barrier") of bytes per rank after the work
// queued on stream and then does what mode (FAKE_GLOO_*) says with its Work.
// It returns 0 or the simulator's error.
extern "C" TORCH_API int slowrank_fake_gloo_call(void* p, const char* op, double bytes, struct CUstream_st* stream,
                                                 int mode) {
  auto* pg = static_cast<ProcessGroupGloo*>(p);
  if (!pg || !op || mode < FAKE_GLOO_NO_WAIT || mode > FAKE_GLOO_KEEP_WORK) return FG_EINVAL;
  pg->caller = stream;
  std::vector<at::Tensor> t(1);
  t[0].bytes = bytes;
  std::vector<std::vector<at::Tensor>> lists(1, t);
  c10::intrusive_ptr<c10d::Work> w;
  if (std::strcmp(op, "allreduce") == 0) {
    w = pg->allreduce(t, c10d::AllreduceOptions());
  } else if (std::strcmp(op, "broadcast") == 0) {
    w = pg->broadcast(t, c10d::BroadcastOptions());
  } else if (std::strcmp(op, "allgather") == 0) {
    w = pg->allgather(lists, t, c10d::AllgatherOptions());
  } else if (std::strcmp(op, "reduce_scatter") == 0) {
    w = pg->reduce_scatter(t, lists, c10d::ReduceScatterOptions());
  } else if (std::strcmp(op, "barrier") == 0) {
    w = pg->barrier(c10d::BarrierOptions());
  } else {
    return FG_EINVAL;
  }
  if (!w.get()) return pg->err;
  switch (mode) {
  case FAKE_GLOO_WAIT_NOW:
    w->wait(std::chrono::milliseconds(0));
    break;
  case FAKE_GLOO_KEEP_FUTURE:
    pg->keptFutures.push_back(w->getFuture());
    break;
  case FAKE_GLOO_KEEP_WORK:
    pg->keptWorks.push_back(std::move(w));
    break;
  }
  return pg->err;
}

// slowrank_fake_gloo_finalize waits for the kept work in issue order, each
// future in c10::ivalue::Future::wait and each Work in Work::wait, with
// stream as the current stream (DDP's finalize_backward), and forgets it.
extern "C" TORCH_API int slowrank_fake_gloo_finalize(void* p, struct CUstream_st* stream) {
  auto* pg = static_cast<ProcessGroupGloo*>(p);
  if (!pg || !stream) return FG_EINVAL;
  pg->caller = stream;
  for (auto& f : pg->keptFutures) f->wait();
  for (auto& w : pg->keptWorks) w->wait(std::chrono::milliseconds(0));
  pg->keptFutures.clear();
  pg->keptWorks.clear();
  return pg->err;
}

// slowrank_fake_gloo_join makes stream wait for every collective issued so
// far (DDP's finalize_backward before the optimizer step).
extern "C" TORCH_API int slowrank_fake_gloo_join(void* p, struct CUstream_st* stream) {
  auto* pg = static_cast<ProcessGroupGloo*>(p);
  if (!pg || !stream) return FG_EINVAL;
  int e = slowrank_fake_event_record(pg->done, pg->stream);
  if (e == FG_OK) e = slowrank_fake_stream_wait_event(stream, pg->done);
  return e;
}

// slowrank_fake_gloo_free waits for the group's work and leaves it.
extern "C" TORCH_API void slowrank_fake_gloo_free(void* p) {
  auto* pg = static_cast<ProcessGroupGloo*>(p);
  if (!pg) return;
  if (!pg->echo()) slowrank_fake_stream_sync(pg->stream);
  pg->leave();
  delete pg;
}

// slowrank_fake_gloo_probe is one bucket as bpf/'s probe test drives it: an
// allreduce, Work::wait on its work and c10::ivalue::Future::wait on its
// future, each probed method called once. It reports the work and future
// (the `this` of their waits; both are freed on return) and returns 0 or
// the simulator's error.
extern "C" TORCH_API int slowrank_fake_gloo_probe(void* p, void** work, void** future) {
  auto* pg = static_cast<ProcessGroupGloo*>(p);
  if (!pg || !work || !future) return FG_EINVAL;
  std::vector<at::Tensor> t(3);
  c10::intrusive_ptr<c10d::Work> w = pg->allreduce(t, c10d::AllreduceOptions());
  w->wait(std::chrono::milliseconds(5));
  c10::intrusive_ptr<c10::ivalue::Future> f = w->getFuture();
  f->wait();
  *work = w.get();
  *future = f.get();
  return pg->err;
}
