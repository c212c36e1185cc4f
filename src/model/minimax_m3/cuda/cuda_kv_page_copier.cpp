#include "model/minimax_m3/cuda/cuda_kv_page_copier.h"

#include <string>
#include <utility>

#include "backend/cuda/runtime/device_memory.h"
#include "backend/cuda/runtime/graph.h"
#include "backend/cuda/runtime/stream.h"

namespace m3::minimax_m3 {

struct CudaKvPageCopier::Rank {
  CudaM3Model* model = nullptr;
  cuda::Stream copy;
  cuda::Event compute_done;  // the compute stream's point a save's copies wait for
  cuda::Event loaded;        // the copy stream's point the compute stream waits for after a load
  int64_t bytes = 0;         // this rank's shard of a page
};

// One save(): its pages, and an event on each rank's copy stream after its copies.
struct CudaKvPageCopier::SaveBatch {
  std::vector<PageId> pages;
  std::vector<cuda::Event> done;  // per rank
  bool released = false;          // one of its pages went back to the pool: a forward waits
};

namespace {

// The host tier in page-locked memory (full-speed, asynchronous copies), reserved once.
class PinnedPageArena final : public HostPageArena {
 public:
  std::byte* data() override { return data_; }
  int64_t size() const override { return size_; }
  Status reserve(int64_t bytes) {
    M3_ASSIGN_OR_RETURN(uint8_t* p, buffer_.reserve(static_cast<size_t>(bytes), nullptr));
    data_ = reinterpret_cast<std::byte*>(p);
    size_ = bytes;
    return Status::ok();
  }

 private:
  cuda::PinnedHostBuffer buffer_;
  std::byte* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace

Result<std::unique_ptr<CudaKvPageCopier>> CudaKvPageCopier::create(std::vector<CudaM3Model*> ranks) {
  if (ranks.empty()) return invalid_argument("[cuda_kv_page_copier] no ranks");
  std::unique_ptr<CudaKvPageCopier> c(new CudaKvPageCopier());
  for (CudaM3Model* m : ranks) {
    if (m->num_kv_pages() != ranks.front()->num_kv_pages())
      return invalid_argument("[cuda_kv_page_copier] the ranks' KV pools differ in pages");
    auto r = std::make_unique<Rank>();
    r->model = m;
    M3_RETURN_IF_ERROR(cuda::set_current_device(m->device()));
    M3_ASSIGN_OR_RETURN(r->copy, cuda::Stream::create());
    M3_ASSIGN_OR_RETURN(r->compute_done, cuda::Event::create());
    M3_ASSIGN_OR_RETURN(r->loaded, cuda::Event::create());
    for (const auto& run : m->kv_page_runs(0)) r->bytes += run.second;
    c->page_bytes_ += r->bytes;
    c->ranks_.push_back(std::move(r));
  }
  return c;
}

CudaKvPageCopier::~CudaKvPageCopier() {
  // Copies still queued read or write host memory the cache is about to free.
  (void)wait();
}

std::unique_ptr<HostPageArena> CudaKvPageCopier::allocate_host_arena(int64_t bytes) {
  if (!cuda::set_current_device(ranks_.front()->model->device()).is_ok()) return nullptr;
  auto arena = std::make_unique<PinnedPageArena>();
  if (!arena->reserve(bytes).is_ok()) return nullptr;  // the caller names the size in its error
  return arena;
}

Status CudaKvPageCopier::check(const PageCopy& c, const char* op) const {
  const int64_t pages = ranks_.front()->model->num_kv_pages();
  if (c.device_page < 0 || c.device_page >= pages || c.host == nullptr) {
    return internal_error(std::string("[cuda_kv_page_copier.") + op + "] page " +
                          std::to_string(c.device_page) + " of " + std::to_string(pages) +
                          (c.host == nullptr ? ", null host memory" : ""));
  }
  return Status::ok();
}

Status CudaKvPageCopier::save(std::span<const PageCopy> copies) {
  M3_RETURN_IF_ERROR(copy(copies, true));
  SaveBatch batch;
  for (const PageCopy& c : copies) batch.pages.push_back(c.device_page);
  for (const std::unique_ptr<Rank>& r : ranks_) {
    M3_RETURN_IF_ERROR(cuda::set_current_device(r->model->device()));
    M3_ASSIGN_OR_RETURN(cuda::Event e, cuda::Event::create());
    M3_RETURN_IF_ERROR(e.record(r->copy.get()));
    batch.done.push_back(std::move(e));
  }
  saves_.push_back(std::move(batch));
  return Status::ok();
}

void CudaKvPageCopier::release(PageId page) {
  for (SaveBatch& b : saves_) {
    for (PageId p : b.pages) b.released = b.released || p == page;
  }
}

Status CudaKvPageCopier::order_before_forward() {
  // Loads already made the compute streams wait. Of the saves: those reached are forgotten;
  // a released page's save becomes a wait of every compute stream (then it is forgotten too:
  // everything queued later on those streams comes after it); the rest run on.
  for (auto it = saves_.begin(); it != saves_.end();) {
    bool reached = true;
    for (size_t i = 0; i < ranks_.size() && reached; ++i) {
      M3_RETURN_IF_ERROR(cuda::set_current_device(ranks_[i]->model->device()));
      M3_ASSIGN_OR_RETURN(reached, it->done[i].reached());
    }
    if (!reached && it->released) {
      for (size_t i = 0; i < ranks_.size(); ++i) {
        M3_RETURN_IF_ERROR(cuda::set_current_device(ranks_[i]->model->device()));
        M3_RETURN_IF_ERROR(it->done[i].make_wait(ranks_[i]->model->stream()));
      }
      reached = true;
    }
    it = reached ? saves_.erase(it) : std::next(it);
  }
  return Status::ok();
}

Status CudaKvPageCopier::load(std::span<const PageCopy> copies) { return copy(copies, false); }

Status CudaKvPageCopier::copy(std::span<const PageCopy> copies, bool to_host) {
  for (const PageCopy& c : copies) M3_RETURN_IF_ERROR(check(c, to_host ? "save" : "load"));
  int64_t offset = 0;
  for (const std::unique_ptr<Rank>& r : ranks_) {
    M3_RETURN_IF_ERROR(cuda::set_current_device(r->model->device()));
    // After the compute work queued so far: the forward that wrote a saved page, or the last
    // reads of a page a load overwrites.
    M3_RETURN_IF_ERROR(r->compute_done.record(r->model->stream()));
    M3_RETURN_IF_ERROR(r->compute_done.make_wait(r->copy.get()));
    for (const PageCopy& c : copies) {
      std::byte* at = c.host + offset;
      for (const auto& [device, bytes] : r->model->kv_page_runs(c.device_page)) {
        M3_RETURN_IF_ERROR(to_host ? cuda::copy_to_host_async(at, device, size_t(bytes), r->copy.get())
                                   : cuda::copy_to_device_async(device, at, size_t(bytes),
                                                                r->copy.get()));
        at += bytes;
      }
    }
    if (!to_host) {  // the next forward reads the loaded pages
      M3_RETURN_IF_ERROR(r->loaded.record(r->copy.get()));
      M3_RETURN_IF_ERROR(r->loaded.make_wait(r->model->stream()));
    }
    offset += r->bytes;
  }
  return Status::ok();
}

Status CudaKvPageCopier::wait() {
  for (const std::unique_ptr<Rank>& r : ranks_) {
    M3_RETURN_IF_ERROR(cuda::set_current_device(r->model->device()));
    M3_RETURN_IF_ERROR(r->copy.synchronize());
  }
  saves_.clear();
  return Status::ok();
}

}  // namespace m3::minimax_m3
